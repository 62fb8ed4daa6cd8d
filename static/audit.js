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
      // A client's report of other input than the call was allowed: marked, never blended in.
      if (e.kind === "call.reported" && p.input_matches === false) call.mismatch = true;
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
        row.appendChild(text("td", c.status + (c.mismatch ? ": input differs" : ""),
          "status-" + c.status + (c.mismatch ? " report-mismatch" : "")));
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
    document.body.addEventListener("htmx:wsClose", function () { setState("reconnecting…", "off"); });

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
    if (root && document.getElementById("audit-events")) start(root);
    if (document.getElementById("audit-live")) timeline();
  });
})();
