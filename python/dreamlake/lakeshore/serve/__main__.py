"""python -m dreamlake.lakeshore.serve module:function"""

import sys

# The package, not this file, holds the registered body: a module run with
# -m under the name __main__ is a second copy, so it only calls in.
from dreamlake.lakeshore.serve import main

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
