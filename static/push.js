// The "Push to this device" button: registers the service worker and sends the browser's
// push subscription to Harness. Only the subscription crosses; nothing here builds HTML.
(function () {
  "use strict";
  var button = document.getElementById("enable-push");
  if (!button || !("serviceWorker" in navigator) || !("PushManager" in window)) return;
  var key = button.getAttribute("data-vapid-key");
  if (!key) return;
  button.hidden = false;

  function bytes(base64url) {
    var padded = base64url + "===".slice((base64url.length + 3) % 4);
    var raw = atob(padded.replace(/-/g, "+").replace(/_/g, "/"));
    var out = new Uint8Array(raw.length);
    for (var i = 0; i < raw.length; i++) out[i] = raw.charCodeAt(i);
    return out;
  }
  function csrf() {
    var match = document.cookie.match(/(?:^|; )csrftoken=([^;]+)/);
    return match ? decodeURIComponent(match[1]) : "";
  }

  button.addEventListener("click", function () {
    navigator.serviceWorker.register(button.getAttribute("data-worker"), { scope: "/approvals/" })
      .then(function (registration) {
        return registration.pushManager.subscribe({ userVisibleOnly: true, applicationServerKey: bytes(key) });
      })
      .then(function (subscription) {
        return fetch(button.getAttribute("data-url"), {
          method: "POST",
          credentials: "same-origin",
          headers: { "Content-Type": "application/json", "X-CSRFToken": csrf() },
          body: JSON.stringify(subscription.toJSON())
        });
      })
      .then(function (response) {
        button.textContent = response.ok ? "Push notifications on" : "Could not subscribe";
        button.disabled = response.ok;
      })
      .catch(function () { button.textContent = "Push is not available in this browser"; });
  });
})();
