// Step-up: a verdict a rule asks a passkey for is signed before the form is sent.
// The challenge comes from the server (it binds the request, the call's digest, the
// verdict and a one-time nonce); the browser's WebAuthn API asks the person to touch
// their passkey; the assertion goes with the form as JSON. Nothing here builds HTML.
(function () {
  "use strict";

  function csrfToken(form) {
    var input = form.querySelector("input[name=csrfmiddlewaretoken]");
    return input ? input.value : "";
  }

  function say(form, text) {
    var status = document.getElementById("decision-status");
    var p = document.createElement("p");
    p.className = "notice bad step-up-error";
    p.textContent = text;
    if (status) {
      status.replaceChildren(p);
    } else {
      form.prepend(p);
    }
  }

  function sign(form, verdict) {
    var body = new URLSearchParams();
    body.set("verdict", verdict);
    return fetch(form.dataset.challengeUrl, {
      method: "POST",
      credentials: "same-origin",
      headers: { "X-CSRFToken": csrfToken(form) },
      body: body,
    })
      .then(function (response) {
        return response.json().then(function (data) {
          if (!response.ok) throw new Error(data.error || "The passkey challenge failed.");
          return data.publicKey;
        });
      })
      .then(function (options) {
        var publicKey = PublicKeyCredential.parseRequestOptionsFromJSON(options);
        return navigator.credentials.get({ publicKey: publicKey });
      })
      .then(function (credential) {
        if (!credential) throw new Error("No passkey answered.");
        return JSON.stringify(credential.toJSON());
      });
  }

  document.addEventListener(
    "submit",
    function (event) {
      var form = event.target;
      if (!form.matches || !form.matches("form.decide.step-up")) return;
      var submitter = event.submitter;
      var action = submitter && submitter.name === "action" ? submitter.value : "";
      var verdict = action === "deny" ? "deny" : "approve";
      var needs = (form.dataset.stepUp || "").split(" ");
      var assertion = form.querySelector("input[name=assertion]");
      var hiddenAction = form.querySelector("input[name=action]");
      hiddenAction.value = action;
      hiddenAction.disabled = false;
      if (needs.indexOf(verdict) < 0) return; // this verdict is not signed: a plain POST
      event.preventDefault();
      event.stopImmediatePropagation();
      if (!window.PublicKeyCredential || !PublicKeyCredential.parseRequestOptionsFromJSON) {
        say(form, "This browser cannot sign with a passkey (WebAuthn). Use a current browser.");
        return;
      }
      sign(form, verdict).then(
        function (json) {
          assertion.value = json;
          assertion.disabled = false;
          form.submit(); // a plain POST: the answer is the queue, or the page with why not
        },
        function (error) {
          say(form, "Not signed: " + (error && error.message ? error.message : error));
        }
      );
    },
    true
  );
})();
