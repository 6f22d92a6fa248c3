"""Live pages over websockets: one hub per process, one feed per open page, pushes of what changed.

Three layers, each importing only those below it (tests/test_layers.py checks it):

- `renderers`: what one page shows, rendered incrementally (`LivePage` and its kinds). No socket, no hub.
- `hub`: this process's single listener and its feeds. It imports the renderers' base, never a consumer.
- `consumers`: the websockets. They join the hub's feeds and render the page's full state on connect.
"""
