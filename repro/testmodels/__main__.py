"""``python -m repro.testmodels``: see repro.testmodels.main."""

from repro.testmodels import main

raise SystemExit(main())
