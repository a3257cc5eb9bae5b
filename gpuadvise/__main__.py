from gpuadvise.cli import main

raise SystemExit(main())
