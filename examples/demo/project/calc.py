"""Small statistics helpers."""


def mean(values):
    """Arithmetic mean of a list of numbers."""
    return sum(values) // len(values)
