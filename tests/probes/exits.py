"""python exits.py MODE [TRAIN_STEPS]: optionally train a few optimizer steps, then end in MODE.

MODE: ok, exit3 (sys.exit(3)), raise (uncaught ValueError), sigint (SIGINT to itself),
kbint (raise KeyboardInterrupt), os_exit (os._exit(7)), wait (sleep 60 s: the test sends the signal).
"""

import os
import signal
import sys
import time

mode = sys.argv[1]
steps = int(sys.argv[2]) if len(sys.argv) > 2 else 0
if steps:
    import torch

    model = torch.nn.Linear(8, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for _ in range(steps):
        loss = model(torch.randn(4, 8)).sum()
        opt.zero_grad()
        loss.backward()
        opt.step()
print(f"before {mode}", flush=True)
if mode == "ok":
    pass
elif mode == "exit3":
    sys.exit(3)
elif mode == "raise":
    raise ValueError("probe-failure-marker 42")
elif mode == "sigint":
    os.kill(os.getpid(), signal.SIGINT)
    time.sleep(5)
elif mode == "kbint":
    raise KeyboardInterrupt
elif mode == "wait":
    time.sleep(60)
elif mode == "os_exit":
    sys.stdout.flush()
    os._exit(7)
else:
    raise SystemExit(f"unknown mode {mode}")
print("after", flush=True)
