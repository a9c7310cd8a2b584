"""Optimizers and learning-rate schedules, as torch.optim."""
from metagraph.optim import lr_scheduler
from metagraph.optim.optimizer import SGD, Adam, AdamW, Optimizer, RMSprop
