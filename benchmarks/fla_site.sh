# Sourced by the GPU scripts: where fla-core is not importable, the wheels in .whl/ are installed into
# /tmp/flashcheck-site (the GPU machine has no network) once a machine, and that folder joins PYTHONPATH.
if ! python3 -c "import fla" 2>/dev/null && ls .whl/*.whl >/dev/null 2>&1; then
  if [ ! -e /tmp/flashcheck-site/.installed ]; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/flashcheck-site \
        .whl/*.whl && touch /tmp/flashcheck-site/.installed
  fi
  export PYTHONPATH=/tmp/flashcheck-site:$PYTHONPATH  # first: a carried wheel newer than the machine's copy wins
fi
