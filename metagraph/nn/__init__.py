"""Neural-network building blocks."""
from metagraph.nn import functional
