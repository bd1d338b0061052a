#!/bin/sh
# Print the path of a Python >= 3.12, looking on PATH and under pyenv; fail loudly if none.
for candidate in python3.13 python3.12 python3 \
    "$HOME"/.pyenv/versions/3.13*/bin/python3 "$HOME"/.pyenv/versions/3.12*/bin/python3 \
    /usr/local/bin/python3.13 /usr/local/bin/python3.12 /usr/bin/python3.13 /usr/bin/python3.12; do
  path=$(command -v "$candidate" 2>/dev/null) || continue
  if "$path" -c 'import sys; sys.exit(sys.version_info < (3, 12))' 2>/dev/null; then
    echo "$path"
    exit 0
  fi
done
echo "No Python 3.12 or newer found (looked on PATH and in ~/.pyenv/versions)." >&2
echo "Install one (e.g. 'pyenv install 3.12') and run make again." >&2
exit 1
