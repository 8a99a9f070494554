"""Error types that carry a message a user can act on."""


class MinedraftError(Exception):
    """Base class for errors the project raises on purpose."""


class ModelLoadError(MinedraftError):
    """A model folder is missing, broken or holds an architecture we do not run."""


class InvalidRequestError(MinedraftError, ValueError):
    """A request's prompt or sampling parameters cannot be served as given."""


class OutOfBlocksError(MinedraftError):
    """The paged KV cache has no free block left for an allocation."""
