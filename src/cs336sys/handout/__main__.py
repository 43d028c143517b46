"""``python -m cs336sys.handout``: one answers page over several runs (:mod:`cs336sys.handout.page`)."""

from cs336sys.handout.page import main

raise SystemExit(main())
