"""The ISS's error type, in its own module so that every unit model can import it."""

__all__ = ["IssError"]


class IssError(RuntimeError):
    """A program did something the hardware cannot (bad register value, runaway program)."""
