"""The realisation pipeline: pending graph -> schedule -> render -> compile -> launch -> tune."""
