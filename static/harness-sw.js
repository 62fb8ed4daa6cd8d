// Harness push service worker: shows an ask as a notification whose actions open the
// one-tap link pages (which show the whole call and ask to confirm). Nothing here decides.
self.addEventListener("push", function (event) {
  var data = {};
  try { data = event.data ? event.data.json() : {}; } catch (e) { data = {}; }
  var title = data.title || "Harness: a call asks for approval";
  event.waitUntil(self.registration.showNotification(title, {
    body: data.body || "",
    tag: data.tag || "harness",
    data: { url: data.url || "/approvals/", approve: data.approve || "", deny: data.deny || "" },
    // No one-tap links (a recipient who must set up a second factor first): no actions.
    actions: data.approve ? [
      { action: "approve", title: "Approve…" },
      { action: "deny", title: "Deny…" }
    ] : [],
    requireInteraction: true
  }));
});

self.addEventListener("notificationclick", function (event) {
  var data = event.notification.data || {};
  var target = (event.action === "approve" && data.approve) ||
               (event.action === "deny" && data.deny) || data.url || "/approvals/";
  event.notification.close();
  event.waitUntil(self.clients.openWindow(target));
});
