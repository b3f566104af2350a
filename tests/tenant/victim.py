"""Another project's job, the target of attack.py: output, a checkpoint, a token in its
environment, then it waits to be stopped."""

import os
import time
from pathlib import Path

print("victim's private output", flush=True)
Path(os.environ["FAIRLANE_CHECKPOINT_DIR"], "state").write_text("victim's state")
time.sleep(600)
