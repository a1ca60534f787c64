import sys

from joulesched.cli import main

sys.exit(main())
