// The dot in the header shows whether live updates arrive; the page re-syncs by itself on reconnect
// (the server sends the current state on every websocket connect).
(function () {
  var dot = document.getElementById("live-status");
  if (!dot) return;
  document.body.addEventListener("htmx:wsOpen", function () { dot.className = "live-status on"; dot.title = "Live"; });
  document.body.addEventListener("htmx:wsClose", function () { dot.className = "live-status off"; dot.title = "Reconnecting…"; });
  document.body.addEventListener("htmx:wsAfterMessage", function () { dot.classList.add("pulse"); setTimeout(function () { dot.classList.remove("pulse"); }, 300); });
})();
