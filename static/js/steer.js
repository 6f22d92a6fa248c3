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
  var focusedIndex = -1, focusedEl = null;
  function listen(path) {
    var failures = 0;
    function connect() {
      var socket = new WebSocket((location.protocol === "https:" ? "wss://" : "ws://") + location.host + path);
      socket.onmessage = function (evt) {
        failures = 0;
        if (window.live && typeof evt.data === "string") window.live.apply(evt.data);
        titleUpdate();
      };
      socket.onclose = function (evt) {
        if (evt.code === 4401 || evt.code === 4404) return;
        failures++;
        setTimeout(connect, Math.min(10000, 500 * Math.pow(2, Math.min(failures - 1, 5))) * (0.75 + Math.random() / 2));
      };
    }
    connect();
  }
  function start() {
    titleUpdate();
    var notify = document.getElementById("inbox-notify");
    if (notify && window.Notification && Notification.permission === "default") {
      notify.hidden = false;
      notify.addEventListener("click", function () { Notification.requestPermission().then(function () { notify.hidden = true; }); });
    }
    // Keep the keyboard in the inbox: when the focused item was decided (removed), focus the one now in its place.
    document.addEventListener("focusin", function (e) {
      var it = e.target && e.target.closest ? e.target.closest("#inbox-list .inbox-item") : null;
      if (it) { focusedIndex = items().indexOf(it); focusedEl = it; }
    });
    function refocus() {
      titleUpdate();
      // Only when the focused item itself left the page; a push never takes focus from anywhere else.
      if (!focusedEl || focusedEl.isConnected || (document.activeElement && document.activeElement !== document.body)) return;
      focusedEl = null;
      var list = items();
      if (list.length) list[Math.min(focusedIndex, list.length - 1)].focus({ preventScroll: true });
    }
    document.addEventListener("live:applied", refocus);
    document.body.addEventListener("htmx:afterSettle", refocus);
    document.body.addEventListener("htmx:afterRequest", function () { setTimeout(refocus, 0); });
    // The inbox count in the navigation, and who else views a plan: small sockets of their own, whose pushes
    // are merged by live.js like the page's own.
    Array.prototype.forEach.call(document.querySelectorAll("[data-steer-live]"), function (el) { listen(el.getAttribute("data-steer-live")); });
    var graph = document.querySelector("[data-graph]");
    if (graph && window.htmx) {
      var pending = null;
      document.addEventListener("live:applied", function () {  // steps may have moved: redraw the graph
        clearTimeout(pending);
        pending = setTimeout(function () {
          if (document.getElementById("plan-graph")) window.htmx.ajax("GET", graph.getAttribute("data-graph"), { target: "#plan-graph", swap: "outerHTML" });
        }, 300);
      });
    }
    // Decisions (every hx-post form whose answer is swapped by id: inbox, plan page, agent page) are sent from the
    // page, not from their form: a push may remove the decided item (and its form) before the answer arrives, and
    // htmx, looking for the answer's targets from a form no longer in the page, would find none (no confirmation,
    // and an htmx:oobErrorNoTarget per section).
    document.addEventListener("submit", function (e) {
      var form = e.target;
      if (!window.htmx || !form.getAttribute || !form.getAttribute("hx-post") || form.getAttribute("hx-swap") !== "none") return;
      e.preventDefault();
      e.stopPropagation();  // capture phase: htmx's own listener on the form never sees it
      var question = form.getAttribute("hx-confirm");
      if (question && !window.confirm(question)) return;
      var values = window.htmx.values(form);
      if (e.submitter && e.submitter.name) values[e.submitter.name] = e.submitter.value;
      var buttons = Array.prototype.slice.call(form.querySelectorAll("button:not([disabled])"));
      buttons.forEach(function (b) { b.disabled = true; });
      var post = function () {
        return window.htmx.ajax("POST", form.getAttribute("hx-post"), { source: document.body, values: values, swap: "none" });
      };
      // A request that never reached the server is told at the form (live.js, htmx:sendError), not thrown.
      (window.live && window.live.send ? window.live.send(form, post) : post())
        .catch(function () { return null; })
        .finally(function () { buttons.forEach(function (b) { b.disabled = false; }); setTimeout(refocus, 0); });
    }, true);
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
