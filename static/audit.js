// Audit replay and live timeline.
(function () {
  "use strict";

  // The replay: the server rendered every step's event and every state of every call,
  // each marked with the steps it stands for (data-first to data-last, audit/replay.py).
  // This only moves between steps: it shows the marked elements of the step a reader is on.
  function start(root) {
    var marked = Array.prototype.map.call(root.querySelectorAll("[data-first]"), function (el) {
      return { el: el, first: +el.getAttribute("data-first"), last: +el.getAttribute("data-last") };
    });
    var scrub = root.querySelector('[data-action="scrub"]');
    var play = root.querySelector('[data-action="play"]');
    var position = root.querySelector('[data-role="position"]');
    var count = parseInt(scrub.max, 10), index = 0, timer = null;

    function render() {
      position.textContent = "Step " + (index + 1) + " of " + count;
      scrub.value = String(index + 1);
      marked.forEach(function (m) { m.el.hidden = index < m.first || index > m.last; });
    }

    function go(to) {
      index = Math.max(0, Math.min(count - 1, to));
      render();
      if (index === count - 1) stop();
    }
    function stop() { if (timer) { clearInterval(timer); timer = null; } play.textContent = "Play"; }

    root.addEventListener("click", function (ev) {
      var action = ev.target.getAttribute && ev.target.getAttribute("data-action");
      if (action === "prev") { stop(); go(index - 1); }
      if (action === "next") { stop(); go(index + 1); }
      if (action === "play") {
        if (timer) { stop(); return; }
        if (index === count - 1) go(0);
        play.textContent = "Pause";
        timer = setInterval(function () { go(index + 1); }, 800);
      }
    });
    scrub.addEventListener("input", function () { stop(); go(parseInt(scrub.value, 10) - 1); });
  }

  // Live timeline: htmx's WebSocket extension receives the session's summary (swapped in
  // by id) and the calls fragment reloads its own page (its hx-get). Two things htmx does
  // not do: say whether the page is live, and keep the calls a reader expanded open when
  // the fragment is replaced.
  // Listeners sit on the body: a history restore replaces everything inside it.
  function timeline() {
    function setState(text, cls) {
      var state = document.getElementById("live-state");
      if (!state) return;
      state.textContent = text;
      state.className = "live-state " + cls;
    }
    document.body.addEventListener("htmx:wsOpen", function () { setState("live", "on"); });
    document.body.addEventListener("htmx:wsClose", function (ev) {
      setState("reconnecting…", "off");
      // 4403: closed because this person's access changed (a role, a team, their
      // password): open it again, checked anew (htmx reopens only after 1006/1011-1013).
      var closed = ev.detail && ev.detail.event;
      var socket = ev.detail && ev.detail.socketWrapper;
      if (closed && closed.code === 4403 && socket) setTimeout(socket.reconnect, 1000);
    });

    var open = [];
    document.body.addEventListener("htmx:beforeSwap", function (ev) {
      if (!ev.detail.target || ev.detail.target.id !== "audit-calls") return;
      open = Array.prototype.map.call(
        document.querySelectorAll("#audit-calls article.audit-call > details[open]"),
        function (d) { return d.parentNode.id; }
      );
    });
    document.body.addEventListener("htmx:afterSwap", function () {
      open.forEach(function (id) {
        var call = document.getElementById(id);
        var details = call && call.querySelector(":scope > details");
        if (details) details.open = true;
      });
      open = [];
    });
  }

  document.addEventListener("DOMContentLoaded", function () {
    var root = document.getElementById("audit-replay");
    if (root) start(root);
    if (document.getElementById("audit-live")) timeline();
  });
})();
