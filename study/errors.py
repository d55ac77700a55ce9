"""The base of every error that is the user's to fix (bad input, wrong database, ...).

The CLI turns these into one line per problem on stderr and exit code 2; the proxy turns the
equivalent request problems into the protocol's own error shape.
"""


class FlowtrialError(Exception):
    """A problem the user can fix; its message says what is wrong and what to do."""
