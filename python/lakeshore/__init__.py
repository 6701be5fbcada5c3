"""``lakeshore``: the older import name of ``dreamlake.lakeshore``.

``import lakeshore`` and ``from lakeshore import lifecycle`` keep working
and reach the very modules ``dreamlake.lakeshore`` holds (one module object
each, so state such as lifecycle's shutdown hooks is shared, and a test
that patches one name patches both). New code writes
``from dreamlake import lakeshore``.
"""

import sys as _sys

import dreamlake.lakeshore as _dls
from dreamlake.lakeshore import *  # noqa: F401,F403 - the alias re-exports everything
from dreamlake.lakeshore import __all__  # noqa: F401

# dreamlake.lakeshore imports every submodule, so each is in sys.modules by
# now: entering them under this name makes `import lakeshore.lifecycle` find
# the same module instead of loading the file a second time.
for _name, _module in list(_sys.modules.items()):
    if _name.startswith(_dls.__name__ + "."):
        _sys.modules[__name__ + _name[len(_dls.__name__):]] = _module
del _name, _module
