// Audit replay: step through a session's events, showing the state as it was at each one.
// Reads the events from a json_script element; builds the DOM with textContent only.
(function () {
  "use strict";

  function text(tag, value, className) {
    var node = document.createElement(tag);
    node.textContent = value == null ? "" : String(value);
    if (className) node.className = className;
    return node;
  }

  // The state after events[0..index]: every call with its latest status and result.
  function stateAt(events, index) {
    var calls = {}, order = [];
    for (var i = 0; i <= index; i++) {
      var e = events[i], p = e.payload || {}, id = p.call_id;
      if (!id) continue;
      if (!calls[id]) { calls[id] = { tool: p.tool, status: "received", by: "", content: null, presentation: null }; order.push(id); }
      var call = calls[id];
      if (p.to) call.status = p.to;
      if (p.by) call.by = p.by + (p.reason ? ": " + p.reason : "");
      if (e.kind === "call.approval_requested") call.presentation = p.presentation;
      if (p.content != null) call.content = p.content;
    }
    return order.map(function (id) { return calls[id]; });
  }

  function start(root) {
    var events = JSON.parse(document.getElementById("audit-events").textContent);
    var index = 0, timer = null;
    var q = function (role) { return root.querySelector('[data-role="' + role + '"]'); };
    var scrub = root.querySelector('[data-action="scrub"]');
    var play = root.querySelector('[data-action="play"]');

    function render() {
      var e = events[index];
      q("position").textContent = "Step " + (index + 1) + " of " + events.length;
      scrub.value = String(index + 1);
      q("event").textContent = "#" + e.seq + " " + e.kind + " by " + e.actor + " at " + e.at;
      q("payload").textContent = JSON.stringify(e.payload, null, 2);
      var calls = stateAt(events, index);
      var pending = q("pending"), rows = q("calls");
      pending.replaceChildren();
      rows.replaceChildren();
      calls.forEach(function (c) {
        if (c.status === "pending_approval") {
          var item = text("li", c.tool + " is waiting for a reviewer, who sees:");
          item.appendChild(text("pre", JSON.stringify(c.presentation, null, 2)));
          pending.appendChild(item);
        }
        var row = document.createElement("tr");
        row.appendChild(text("td", c.tool));
        row.appendChild(text("td", c.status, "status-" + c.status));
        row.appendChild(text("td", c.by));
        var result = text("td", "");
        if (c.content != null) result.appendChild(text("pre", c.content));
        row.appendChild(result);
        rows.appendChild(row);
      });
      if (!pending.children.length) pending.appendChild(text("li", "none", "muted"));
    }

    function go(to) {
      index = Math.max(0, Math.min(events.length - 1, to));
      render();
      if (index === events.length - 1) stop();
    }
    function stop() { if (timer) { clearInterval(timer); timer = null; } play.textContent = "Play"; }

    root.addEventListener("click", function (ev) {
      var action = ev.target.getAttribute && ev.target.getAttribute("data-action");
      if (action === "prev") { stop(); go(index - 1); }
      if (action === "next") { stop(); go(index + 1); }
      if (action === "play") {
        if (timer) { stop(); return; }
        if (index === events.length - 1) go(0);
        play.textContent = "Pause";
        timer = setInterval(function () { go(index + 1); }, 800);
      }
    });
    scrub.addEventListener("input", function () { stop(); go(parseInt(scrub.value, 10) - 1); });
    render();
  }

  // Live timeline: the server pushes "changed" for every change of the session's calls
  // (and once on every (re)connect, to catch up); the calls fragment is then re-fetched.
  function live(path) {
    var delay = 500;
    function connect() {
      var scheme = location.protocol === "https:" ? "wss://" : "ws://";
      var socket = new WebSocket(scheme + location.host + path);
      socket.onopen = function () { delay = 500; };
      socket.onmessage = function () { refresh(false); };
      socket.onclose = function () {
        setTimeout(connect, delay);
        delay = Math.min(delay * 2, 10000);
      };
    }
    connect();
  }

  // The timeline shows one page of calls; the page is the one in the address bar
  // (?before=, ?after=, ?call= or none: the newest calls). Live refreshes and the pager
  // both load it through the stable wrapper, which queues a load that arrives while
  // another is in flight (hx-sync queue last) instead of dropping it.
  var scrollAfterSwap = false;

  function refresh(scroll) {
    var wrapper = document.getElementById("audit-live");
    if (!wrapper || !window.htmx) return;
    if (scroll) scrollAfterSwap = true;
    window.htmx.trigger(wrapper, "audit:changed");
  }

  function pager(wrapper) {
    document.body.addEventListener("htmx:configRequest", function (ev) {
      if (ev.detail.elt === wrapper) ev.detail.path = location.pathname + location.search;
    });
    document.body.addEventListener("htmx:afterSwap", function () {
      var calls = document.getElementById("audit-calls");
      if (scrollAfterSwap && calls) calls.scrollIntoView();
      scrollAfterSwap = false;
    });
    wrapper.addEventListener("click", function (ev) {
      var link = ev.target.closest && ev.target.closest("a[data-page]");
      if (!link || ev.button !== 0 || ev.metaKey || ev.ctrlKey || ev.shiftKey || ev.altKey) return;
      ev.preventDefault();
      history.pushState({ auditPage: true }, "", link.href);
      refresh(true);
    });
    window.addEventListener("popstate", function () { refresh(false); });
  }

  document.addEventListener("DOMContentLoaded", function () {
    var root = document.getElementById("audit-replay");
    if (root && document.getElementById("audit-events")) start(root);
    var wrapper = document.getElementById("audit-live");
    if (wrapper) pager(wrapper);
    if (wrapper && wrapper.dataset.live) live(wrapper.dataset.live);
  });
})();
