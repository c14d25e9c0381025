// kai-es serve: live refresh, hand-written, no dependencies. Every data-poll-ms milliseconds it
// asks /api/position how many records the server has folded; when that differs from the number
// the page was rendered at (data-position on <main id="live">), it fetches the same address
// again and replaces the children of <main> with the new ones. The page is not reloaded, so the
// address, the scroll position and the filter form's focus stay. Failed requests (the server is
// stopping, busy) are ignored until the next tick. Nothing is ever sent but GET requests.
(function () {
  "use strict";
  var main = document.getElementById("live");
  if (!main) { return; }
  var period = parseInt(main.getAttribute("data-poll-ms"), 10) || 1000;
  var busy = false;

  function replace(html) {
    var fresh = new DOMParser().parseFromString(html, "text/html").getElementById("live");
    if (!fresh) { return; }
    var active = document.activeElement;
    if (active && active.form && main.contains(active)) { return; }  // someone is typing a filter
    main.replaceChildren.apply(main, Array.prototype.slice.call(fresh.childNodes));
    main.setAttribute("data-position", fresh.getAttribute("data-position"));
    document.documentElement.setAttribute("data-refreshed", String(Date.now()));
  }

  function tick() {
    if (busy) { return; }
    busy = true;
    fetch("/api/position", { cache: "no-store" })
      .then(function (r) { return r.ok ? r.text() : null; })
      .then(function (now) {
        if (now === null || now.trim() === main.getAttribute("data-position")) { return null; }
        return fetch(window.location.href, { cache: "no-store" })
          .then(function (r) { return r.ok ? r.text() : null; })
          .then(function (html) { if (html !== null) { replace(html); } });
      })
      .catch(function () { /* try again at the next tick */ })
      .then(function () { busy = false; });
  }

  window.setInterval(tick, period);
})();
