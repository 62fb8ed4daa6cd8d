"""The one exception every service raises for a request it refuses."""


class ServiceError(Exception):
    """A request the service refuses; the message is for the person or agent who asked."""
