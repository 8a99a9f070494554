"""Error types that carry a message a user can act on."""


class MinedraftError(Exception):
    """Base class for errors the project raises on purpose."""


class ModelLoadError(MinedraftError):
    """A model folder is missing, broken or holds an architecture we do not run."""


class InvalidRequestError(MinedraftError, ValueError):
    """A request's prompt or sampling parameters cannot be served as given.

    `param` names the request field to change (the OpenAI error's `param`), when one is to blame.
    """

    def __init__(self, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.param = param


class OutOfBlocksError(MinedraftError):
    """The paged KV cache has no free block left for an allocation."""
