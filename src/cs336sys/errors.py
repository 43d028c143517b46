"""Ground floor: the error a user's config gets, from whichever floor checks that part of it.

The schema and the strict reader (``pipeline``) and the plug-in section (``plugins``, on this
floor beside the catalog it extends) raise the same class, so the workflow and the CLI catch one.
"""


class ConfigError(ValueError):
    """A config key's value is not allowed; the message names the key and what is."""
