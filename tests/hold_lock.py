"""Run as a script: take an flock on the file named by argv[1] and hold it,
as a live process does (a server in another PID namespace, say), until killed."""

import fcntl
import os
import sys
import time

fd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT)
fcntl.flock(fd, fcntl.LOCK_EX)
print("held", flush=True)
time.sleep(60)
