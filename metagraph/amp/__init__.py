"""Mixed precision: `autocast` (ops in bfloat16 or float16 where PyTorch's CPU autocast runs them
so) and `GradScaler` (loss scaling, dynamic or static), as PyTorch's torch.amp."""
from metagraph.amp.autocast import autocast, get_autocast_dtype, is_autocast_enabled
from metagraph.amp.grad_scaler import GradScaler

__all__ = ["GradScaler", "autocast", "get_autocast_dtype", "is_autocast_enabled"]
