#!/bin/sh
# The image's entrypoint. A process name from the Procfile (release, web, worker,
# maintenance, beat) runs that line through a shell, as a Procfile runner does, so the
# image runs exactly what the Procfile says; arguments after the name are appended to the
# line (`worker --concurrency 4`). Anything else runs as given (`python manage.py shell`).
set -eu

if [ "$#" -gt 0 ]; then
  # honcho's own parser reads the Procfile, as bench/systems.py and the tests do.
  if line=$(python - "$1" <<'PY'
import sys

from honcho.environ import parse_procfile

with open("Procfile") as procfile:
    processes = parse_procfile(procfile.read()).processes
if sys.argv[1] not in processes:
    sys.exit(1)
print(processes[sys.argv[1]])
PY
  ); then
    name=$1
    shift
    # bash, not sh: bash -c runs the line's last command in its own place, so gunicorn or
    # celery becomes the container's main process and gets the SIGTERM of `docker stop`
    # itself. Debian's sh (dash) would stay in between as process 1, which ignores it.
    exec bash -c "$line \"\$@\"" "$name" "$@"
  fi
fi
exec "$@"
