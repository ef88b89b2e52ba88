"""A compatibility alias: `portkit.inputs` is `portkit.models.inputs` itself, the declaration API's one documented
import path (docs/guides/declaring-a-model.md); importing it here raises a DeprecationWarning naming that path.

    >>> from portkit.models import inputs     # the documented path
    >>> from portkit import inputs            # the same module, with a DeprecationWarning
"""
import sys
import warnings

from portkit.models import inputs

warnings.warn("portkit.inputs is an alias of portkit.models.inputs, the documented path: import that "
              "(`from portkit.models import inputs`); see docs/changelog.md", DeprecationWarning, stacklevel=2)
sys.modules[__name__] = inputs
