"""``python -m cvae_rosetta.cli`` runs the ``cvae`` command."""

from cvae_rosetta.cli.exits import main

raise SystemExit(main())
