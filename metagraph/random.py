"""The random-number generators behind rand, randn, randint, randperm, dropout and shuffling
DataLoaders: the default one, which mg.manual_seed seeds, and any a user makes (reproducible by seed)."""
import numpy as np

from metagraph.errors import ArgumentError, fail


class Generator:
    """A random-number generator of its own, as torch.Generator: `g = mg.Generator(); g.manual_seed(0)`,
    then `generator=g` to rand, randn, randint, randperm or DataLoader."""

    def __init__(self, device="cpu"):
        if str(device) != "cpu":
            fail(ArgumentError, "Generator", f"device {device!r}: metagraph draws random numbers on the "
                 "host, so only 'cpu' is accepted")
        self.manual_seed(0)

    def manual_seed(self, seed):
        """Restart the sequence from `seed`; returns the generator, as torch's does."""
        self.seed = int(seed)
        self.numpy = np.random.default_rng(self.seed)
        return self

    def initial_seed(self):
        """The seed the sequence last started from."""
        return self.seed


default_generator = Generator()


def manual_seed(seed):
    """Reset the default generator so that later random tensors repeat; returns it."""
    return default_generator.manual_seed(seed)


def numpy_generator(op, generator=None):
    """The numpy generator that `op` draws from: `generator`'s, else the default one's."""
    if generator is None:
        return default_generator.numpy
    if not isinstance(generator, Generator):
        fail(ArgumentError, op, f"generator must be an mg.Generator, got {type(generator).__name__}")
    return generator.numpy
