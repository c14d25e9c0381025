"""`kai-es serve LOG`: a read-only web view of any event log, following it as it grows.

Parts: `follow` folds the log into a `kai_es.visibility.live.LiveView` in a thread (everything
up to the end at start, then each record as it is appended: incremental, never re-folded from
zero); `http` answers GET and HEAD with the pages of `kai_es.visibility.pages`; `bind` decides
which addresses may be served.

Rendering is server-side: every page is HTML made in Python, charts are inline SVG drawn from
integers. The only script is `static/live.js` (hand-written, committed as source, no build step),
which polls ``/api/position`` and swaps the page's `<main>` when the log has grown; the pages
work without it, just without live refresh. Why: nothing outside the machine is reachable (no
CDN, no package registry at run time), the assets are two small files served by this process,
and HTML made from the same pure functions the unit tests call is what the browser shows.

Read-only by construction: the log is opened read-only, there is no handler for any method but
GET and HEAD (others get 405), and no page takes input that reaches the log. It binds to
loopback unless started with ``--allow-remote``.
"""
