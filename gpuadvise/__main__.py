from gpuadvise.analyzer.cli import main

raise SystemExit(main())
