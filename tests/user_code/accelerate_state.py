"""A user's Accelerate script that records, per process, what its Accelerator was configured with (by
`accelerate launch` from the config file): OUT/rank-N.json."""

import json
import os
import socket
import sys

from accelerate import Accelerator

accelerator = Accelerator()
os.makedirs(sys.argv[1], exist_ok=True)
with open(os.path.join(sys.argv[1], f"rank-{accelerator.process_index}.json"), "w") as sink:
    json.dump({"host": socket.gethostname(), "mixed_precision": accelerator.mixed_precision,
               "num_processes": accelerator.num_processes, "distributed_type": str(accelerator.distributed_type),
               "dynamo_backend": os.environ.get("ACCELERATE_DYNAMO_BACKEND")}, sink)
accelerator.wait_for_everyone()
