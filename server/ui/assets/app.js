// Refreshes the parts of the page marked data-live every 2 s from the JSON
// at body[data-live-url]: the server renders them, this only swaps them in.
// Without JavaScript the page works as it is; a reload updates it.
(function () {
  "use strict";
  var url = document.body.getAttribute("data-live-url");
  if (!url || !window.fetch) { return; }
  function busy() {
    // Do not swap a part away under an operator typing a setup command.
    var a = document.activeElement;
    return a && (a.tagName === "INPUT" || a.tagName === "SUMMARY") && a.type !== "submit";
  }
  function tick() {
    fetch(url, { credentials: "same-origin", headers: { "Accept": "application/json" } })
      .then(function (r) { return r.ok ? r.json() : null; })
      .then(function (parts) {
        if (parts && !busy()) {
          document.querySelectorAll("[data-live]").forEach(function (el) {
            var html = parts[el.getAttribute("data-live")];
            if (typeof html === "string") { el.innerHTML = html; }
          });
          document.body.setAttribute("data-refreshed", String(Date.now()));
        }
      })
      .catch(function () {})
      .then(function () { setTimeout(tick, 2000); });
  }
  setTimeout(tick, 2000);
})();
