"""The project's own exception for input it refuses; every domain raises it, none needs another's module for it."""


class InvalidInput(ValueError):
    """User input that cannot be accepted; the message names the field and the value."""
