// The approvals queue: keyboard shortcuts, opt-in notifications and live ages (refusals,
// 400/403/404/409, are swapped by htmx's responseHandling in base.html). Nothing here
// builds HTML from data.
(function () {
  "use strict";

  var live = document.getElementById("approval-live");
  var liveState = document.getElementById("live-state");

  function items() {
    return Array.prototype.slice.call(document.querySelectorAll("article.approval"));
  }

  // --- Keyboard: a / d decide the focused call, j / k move between calls. ---
  document.addEventListener("keydown", function (event) {
    if (event.ctrlKey || event.metaKey || event.altKey) return;
    var target = event.target;
    if (target.closest && target.closest("textarea, input, select, [contenteditable]")) return;
    var item = target.closest ? target.closest("article.approval") : null;
    var key = event.key;
    if (key === "j" || key === "k") {
      var all = items();
      if (!all.length) return;
      var index = item ? all.indexOf(item) : -1;
      var next = key === "j" ? Math.min(index + 1, all.length - 1) : Math.max(index - 1, 0);
      all[next].focus();
      event.preventDefault();
      return;
    }
    if (!item || (key !== "a" && key !== "d")) return;
    var form = item.querySelector("form.decide");
    if (!form) return;
    // A folded item offers no Approve until "Show all" shows it whole: then `a` does nothing.
    var button = form.querySelector(key === "a" ? "button.approve" : "button.deny");
    if (!button) return;
    event.preventDefault();
    button.click();  // a click, so htmx sends the button's name=value like a pointer click
  });

  // --- Ages tick without a reload. ---
  function ago(seconds) {
    if (seconds < 60) return "just now";
    if (seconds < 3600) return Math.floor(seconds / 60) + " min ago";
    if (seconds < 86400) return Math.floor(seconds / 3600) + " h ago";
    return Math.floor(seconds / 86400) + " d ago";
  }
  function refreshAges() {
    var now = Date.now();
    document.querySelectorAll("time.age").forEach(function (el) {
      var then = Date.parse(el.getAttribute("datetime"));
      if (!isNaN(then)) el.textContent = ago(Math.max(0, (now - then) / 1000));
    });
  }
  setInterval(refreshAges, 15000);

  if (!live) return;

  // --- Connection state, so a reviewer knows the queue is live. ---
  function setState(text, cls) {
    if (!liveState) return;
    liveState.textContent = text;
    liveState.className = "live-state " + cls;
  }
  live.addEventListener("htmx:wsOpen", function () { setState("live", "on"); });
  live.addEventListener("htmx:wsClose", function (ev) {
    setState("reconnecting…", "off");
    reopenIfAccessChanged(ev);
  });

  // 4403: the server closed the socket because this person's access changed (a role, a
  // team, their password changed on another page): open it again, checked anew (refused,
  // and retried as any refused socket, if they may no longer see the queue). htmx's
  // extension reopens only after 1006, 1011, 1012 and 1013.
  function reopenIfAccessChanged(ev) {
    var closed = ev.detail && ev.detail.event;
    var socket = ev.detail && ev.detail.socketWrapper;
    if (closed && closed.code === 4403 && socket) setTimeout(socket.reconnect, 1000);
  }

  // --- Opt-in notification when a new ask arrives while the tab is hidden. ---
  var button = document.getElementById("enable-notifications");
  var known = new Set(items().map(function (el) { return el.id; }));
  var firstMessage = true;

  if (button && "Notification" in window && Notification.permission !== "granted") {
    button.hidden = Notification.permission === "denied";
    button.addEventListener("click", function () {
      Notification.requestPermission().then(function (permission) {
        button.hidden = permission !== "default";
      });
    });
  }

  live.addEventListener("htmx:wsAfterMessage", function () {
    var current = items();
    var fresh = current.filter(function (el) { return !known.has(el.id); });
    known = new Set(current.map(function (el) { return el.id; }));
    refreshAges();
    var catchUp = firstMessage;  // the full queue sent on connect is not "new"
    firstMessage = false;
    if (catchUp || !fresh.length || !document.hidden) return;
    if (!("Notification" in window) || Notification.permission !== "granted") return;
    fresh.forEach(function (el) {
      var note = new Notification("Harness: a call asks for approval", {
        body: (el.dataset.tool || "A tool call") + " is waiting for a decision.",
        tag: el.id,
      });
      note.onclick = function () {
        window.focus();
        window.location.href = el.dataset.url;
      };
    });
  });
  live.addEventListener("htmx:wsOpen", function () { firstMessage = true; });
})();
