// The steering pages: the inbox count in the tab title, the inbox keyboard (j/k, a, d), focus kept across pushes,
// and an optional browser notification when new items arrive.
(function () {
  "use strict";
  var baseTitle = null;
  function count() {
    var el = document.getElementById("inbox-count");
    return el ? parseInt(el.getAttribute("data-count") || el.textContent, 10) || 0 : 0;
  }
  var lastCount = null;
  function titleUpdate() {
    var n = count();
    if (baseTitle === null) baseTitle = document.title.replace(/^\(\d+\) /, "");
    if (!/^Inbox /.test(baseTitle)) document.title = (n ? "(" + n + ") " : "") + baseTitle;
    else document.title = baseTitle.replace(/^Inbox \d+/, "Inbox " + n);
    if (lastCount !== null && n > lastCount && window.Notification && Notification.permission === "granted" && document.hidden) {
      new Notification("Agent planner", { body: n + " item" + (n === 1 ? "" : "s") + " wait for you in the inbox." });
    }
    lastCount = n;
  }
  function items() { return Array.prototype.slice.call(document.querySelectorAll("#inbox-list .inbox-item")); }
  function current() {
    var a = document.activeElement;
    return a && a.closest ? a.closest(".inbox-item") : null;
  }
  function move(delta) {
    var list = items();
    if (!list.length) return;
    var i = list.indexOf(current());
    var next = list[Math.max(0, Math.min(list.length - 1, i < 0 ? 0 : i + delta))];
    next.focus();
  }
  var focusedId = null, focusedIndex = -1;
  function start() {
    titleUpdate();
    var notify = document.getElementById("inbox-notify");
    if (notify && window.Notification && Notification.permission === "default") {
      notify.hidden = false;
      notify.addEventListener("click", function () { Notification.requestPermission().then(function () { notify.hidden = true; }); });
    }
    document.body.addEventListener("htmx:oobBeforeSwap", function (e) {
      // A decision in flight from this list brings the fresh list with its answer; a push must not remove the
      // form that sent it first (htmx would then drop the answer, and the operator would not be told).
      var target = e.detail && e.detail.target;
      var fragment = e.detail && e.detail.fragment;
      var answer = fragment && ((fragment.matches && fragment.matches("[data-answer]")) ||
                                (fragment.querySelector && fragment.querySelector("[data-answer]")));
      if (target && target.id === "inbox-list" && target.querySelector(".htmx-request") && !answer) {
        e.detail.shouldSwap = false;
        return;
      }
      var a = document.activeElement;
      focusedId = a && a.id && a.closest && a.closest("#inbox-list") ? a.id : null;
      focusedIndex = focusedId ? items().indexOf(current()) : -1;
    });
    document.body.addEventListener("htmx:oobAfterSwap", function () {
      titleUpdate();
      if (focusedId) {
        var el = document.getElementById(focusedId);
        if (el && document.activeElement !== el) el.focus({ preventScroll: true });
        else if (!el && focusedIndex >= 0) {  // the item was decided: keep the keyboard in the list, on the next one
          var list = items();
          if (list.length) list[Math.min(focusedIndex, list.length - 1)].focus({ preventScroll: true });
        }
        focusedId = null;
      }
    });
    // Every htmx form on every page: its buttons are disabled while its request is in flight (no double decisions).
    document.body.addEventListener("htmx:beforeRequest", function (e) {
      var form = e.detail && e.detail.elt;
      if (!form || form.tagName !== "FORM" || form.hasAttribute("hx-disabled-elt")) return;
      var buttons = Array.prototype.slice.call(form.querySelectorAll("button:not([disabled])"));
      buttons.forEach(function (b) { b.disabled = true; });
      form.addEventListener("htmx:afterRequest", function () { buttons.forEach(function (b) { b.disabled = false; }); }, { once: true });
    });
    document.addEventListener("keydown", function (e) {
      if (!document.getElementById("inbox-list") || e.ctrlKey || e.metaKey || e.altKey) return;
      var t = e.target;
      if (t && (t.tagName === "INPUT" || t.tagName === "TEXTAREA" || t.tagName === "SELECT" || t.isContentEditable)) return;
      var item = current();
      if (e.key === "j") { move(1); e.preventDefault(); }
      else if (e.key === "k") { move(-1); e.preventDefault(); }
      else if (e.key === "a" && item) {
        var approve = item.querySelector("[data-action=approve]");
        if (approve && !approve.disabled) { approve.click(); e.preventDefault(); }
      } else if (e.key === "d" && item) {
        var feedback = item.querySelector("[data-action=feedback]");
        if (feedback) { feedback.focus(); e.preventDefault(); }
      }
    });
  }
  if (document.readyState === "loading") document.addEventListener("DOMContentLoaded", start); else start();
})();
