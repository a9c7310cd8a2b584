"""Backends: each turns a pending sub-graph into realised buffers."""
