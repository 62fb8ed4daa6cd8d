// Dashboard helpers: copy buttons. Nothing here builds HTML from data.
(function () {
  "use strict";
  document.addEventListener("click", function (event) {
    var button = event.target.closest && event.target.closest("button[data-copy]");
    if (!button) return;
    var source = document.querySelector(button.getAttribute("data-copy"));
    if (!source) return;
    var text = source.value !== undefined && source.tagName === "INPUT" ? source.value : source.textContent;
    var section = button.closest("section");
    var state = section && section.querySelector(".copy-state");
    function say(message) { if (state) state.textContent = message; }
    if (navigator.clipboard && window.isSecureContext) {
      navigator.clipboard.writeText(text).then(
        function () { say("Copied."); },
        function () { say("Copy failed: select the text and copy it."); }
      );
    } else if (source.select) {
      source.select();
      say("Selected: press Ctrl+C (or ⌘C) to copy.");
    } else {
      var range = document.createRange();
      range.selectNodeContents(source);
      var selection = window.getSelection();
      selection.removeAllRanges();
      selection.addRange(range);
      say("Selected: press Ctrl+C (or ⌘C) to copy.");
    }
  });
})();

// Rules editor: remove a row (then re-check the form, as any edit does).
(function () {
  "use strict";
  document.addEventListener("click", function (event) {
    var button = event.target.closest && event.target.closest("[data-remove-row]");
    if (!button) return;
    var row = button.closest(".rule-row");
    var form = button.closest("form");
    if (row) row.remove();
    if (form) form.dispatchEvent(new Event("change", { bubbles: true }));
  });
})();
