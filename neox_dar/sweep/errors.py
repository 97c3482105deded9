"""The error every sweep module raises for a problem in a sweep file or its runs."""


class SweepError(ValueError):
    """A problem in a sweep file, reported as one line."""
