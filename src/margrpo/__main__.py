"""`python -m margrpo STAGE ...`: the `margrpo` command, for an environment without its console script."""

from margrpo.cli import main

raise SystemExit(main())
