"""The few named errors attnviz raises; the CLI turns each into one line and exit code 2."""


class AttnvizError(Exception):
    """Base class: a problem the user can fix, reported as one line."""

    exit_code = 2
    label = "error"  # how the CLI's one line starts


class InputError(AttnvizError):
    """Bad text, file, layer/head choice or option value."""


class TextTooLongError(InputError):
    """The text has more tokens than the model takes (batch commands skip such lines)."""


class NotHeldError(InputError):
    """A tile asks for a text the server does not hold (now): `attnviz serve` answers 409."""


class MemoryLimitError(AttnvizError):
    """The run would hold more than the memory available (`core.memory` estimates it)."""


class ModelLoadError(AttnvizError):
    """The model or tokenizer could not be found or loaded."""


class UnsupportedModelError(AttnvizError):
    """The model's architecture is not one attnviz knows how to read."""


class OutputError(AttnvizError):
    """The output location cannot be written."""


class Interrupted(AttnvizError):
    """Ctrl-C: the command stopped; the message says what was written before it did."""

    exit_code = 130
    label = "interrupted"


class RankFailed(AttnvizError):
    """Another process of a distributed run stopped (it died, lost its connection, or the
    launcher stopped the run): nothing was written. `rank` is the one that stopped, if known."""

    exit_code = 1

    def __init__(self, message: str, rank: int | None = None) -> None:
        super().__init__(message)
        self.rank = rank
