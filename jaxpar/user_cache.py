"""Where jaxpar keeps files between runs, for this user: `$JAXPAR_CACHE_DIR`, else
`$XDG_CACHE_HOME/jaxpar`, else `~/.cache/jaxpar`. In it: `onednn/` (the oneDNN convolutions'
library, built once: jaxpar/models/onednn.py), `xla/` (compiled programs, for
`compilation_cache='auto'`: jaxpar/compile_cache.py) and `unreadable-*.json` (an image
folder's files that do not decode, found once: jaxpar/data/sources.py). Everything there can
be deleted; it is made again."""
import os


def folder(*parts: str) -> str:
  """The cache folder (or a path under it: `parts`), made by whoever writes there."""
  root = os.environ.get('JAXPAR_CACHE_DIR') or os.path.join(
      os.environ.get('XDG_CACHE_HOME') or os.path.join(os.path.expanduser('~'), '.cache'),
      'jaxpar')
  return os.path.join(root, *parts)
