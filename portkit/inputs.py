"""The declaration API's documented import path: `portkit.inputs` is `portkit.models.inputs` itself.

    >>> from portkit import inputs
    >>> inputs.Declaration            # the same class as portkit.models.inputs.Declaration
"""
import sys

from portkit.models import inputs as _declarations

sys.modules[__name__] = _declarations
