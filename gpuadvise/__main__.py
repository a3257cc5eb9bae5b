from gpuadvise.cli import console

console()
