"""Each rank says who it is: mpilaunch -n 4 python examples/hello.py"""

import os
import socket

print(
    f"hello from rank {os.environ['RANK']} of {os.environ['WORLD_SIZE']}"
    f" (local rank {os.environ['LOCAL_RANK']}, device {os.environ['DEVICE_ID']}) on {socket.gethostname()}"
)
