import sys

from tfdist.launch.cli import main

sys.exit(main())
