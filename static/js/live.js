// Live pages: one websocket per page (the element with data-live="/ws/..."), and the swaps it pushes.
//
// Each pushed top-level element is merged into the element of the same id ("morphed": attributes
// and children updated in place), so nodes that did not change stay as they are: a link keeps the
// keyboard focus, a <details> stays open, and a form being filled in (focus inside, or text typed)
// is left alone, text and focus included. An element with data-live-prepend="<list id>" is a new
// entry for the top of that list; data-live-remove="<ids>" removes elements.
//
// The server sends the page's full state on every connect, so a reconnect resyncs the page.
// Close codes: 4000 resync now; 4401 logged out; 4404 no such page; anything else: retry with backoff.
(function () {
  "use strict";
  var dot = document.getElementById("live-status");
  var banner = document.getElementById("live-banner");
  var root = document.querySelector("[data-live]");
  var DISCONNECTED = "Disconnected, retrying: what you see may be out of date";

  // Said in words, not only by the dot's colour: the page may be out of date until the connection is back.
  function warn(text) {
    if (!banner) return;
    if (text) { if (banner.textContent !== text) banner.textContent = text; banner.hidden = false; }
    else { banner.hidden = true; banner.textContent = ""; }
  }

  function status(state, title) {
    if (!dot) return;
    dot.className = "live-status " + state;
    dot.title = title;
    dot.setAttribute("aria-label", title);
  }

  function formInUse(form) {
    if (form.contains(document.activeElement)) return true;
    for (var i = 0; i < form.elements.length; i++) {
      var f = form.elements[i];
      if (f.type === "checkbox" || f.type === "radio") { if (f.checked !== f.defaultChecked) return true; }
      else if ((f.tagName === "INPUT" || f.tagName === "TEXTAREA") && f.value !== f.defaultValue) return true;
    }
    return false;
  }

  function typingIn(form) {
    var active = document.activeElement;
    return form.contains(active) && (active.tagName === "TEXTAREA" || (active.tagName === "INPUT" && active.type !== "submit" && active.type !== "button"));
  }

  // A form whose request is under way stays in the page until its answer is in: htmx looks for the
  // answer's targets from the form, and a form removed from the page would find none.
  function sending(form) { return form.classList.contains("htmx-request"); }

  function keep(el) { return el.nodeType === 1 && el.tagName === "FORM" && (sending(el) || formInUse(el)); }

  function syncAttributes(old, neu) {
    var i, name;
    for (i = old.attributes.length - 1; i >= 0; i--) {
      name = old.attributes[i].name;
      if (!neu.hasAttribute(name) && !(name === "open" && old.tagName === "DETAILS")) old.removeAttribute(name);
    }
    for (i = 0; i < neu.attributes.length; i++) {
      name = neu.attributes[i].name;
      if (name === "hx-swap-oob" || name === "data-live-prepend" || name === "data-live-remove") continue;
      if (old.getAttribute(name) !== neu.attributes[i].value) old.setAttribute(name, neu.attributes[i].value);
    }
  }

  function sameKind(a, b) {
    if (a.nodeType !== b.nodeType) return false;
    if (a.nodeType !== 1) return true;
    return a.tagName === b.tagName && (a.id || "") === (b.id || "");
  }

  function morph(old, neu) {
    if (old.nodeType !== 1) {
      if (old.nodeValue !== neu.nodeValue) old.nodeValue = neu.nodeValue;
      return;
    }
    if (keep(old)) return;
    syncAttributes(old, neu);
    if (old.tagName === "TEXTAREA") return;
    morphChildren(old, neu);
  }

  function morphChildren(old, neu) {
    var byId = {};
    var child;
    for (child = old.firstElementChild; child; child = child.nextElementSibling) if (child.id) byId[child.id] = child;
    var cursor = old.firstChild;
    var next = neu.firstChild;
    while (next) {
      var after = next.nextSibling;
      var match = null;
      if (next.nodeType === 1 && next.id) match = byId[next.id] || null;
      else if (cursor && sameKind(cursor, next)) match = cursor;
      if (match && match.parentNode === old) {
        if (match !== cursor) old.insertBefore(match, cursor);
        morph(match, next);
        cursor = match.nextSibling;
      } else {
        old.insertBefore(document.importNode(next, true), cursor);
      }
      next = after;
    }
    while (cursor) {
      var gone = cursor;
      cursor = cursor.nextSibling;
      if (gone.nodeType === 1 && gone.tagName === "FORM" && (sending(gone) || typingIn(gone))) {
        // The decision no longer applies, but the operator is typing in it: kept (marked) until a later
        // push finds them elsewhere; submitting it gets a clear refusal.
        gone.classList.add("stale");
        continue;
      }
      old.removeChild(gone);
    }
  }

  function processed(el) {
    if (window.htmx) window.htmx.process(el);
  }

  function apply(text) {
    var tpl = document.createElement("template");
    tpl.innerHTML = text;
    var items = Array.prototype.slice.call(tpl.content.children);
    items.forEach(function (el) {
      var remove = el.getAttribute("data-live-remove");
      if (remove) remove.split(/\s+/).forEach(function (id) { var gone = document.getElementById(id); if (gone) gone.remove(); });
      if (!el.id) return;
      var current = document.getElementById(el.id);
      if (current) { morph(current, el); processed(current); return; }
      var into = el.getAttribute("data-live-prepend");
      var list = into && document.getElementById(into);
      if (!list) return;  // not on this page (another page of a list, a filtered-out row)
      var node = document.importNode(el, true);
      node.removeAttribute("data-live-prepend");
      node.removeAttribute("data-live-remove");
      list.insertBefore(node, list.firstChild);
      var max = parseInt(list.getAttribute("data-live-max") || "0", 10);
      while (max && list.children.length > max) list.removeChild(list.lastElementChild);
      processed(node);
    });
    if (dot) { dot.classList.add("pulse"); setTimeout(function () { dot.classList.remove("pulse"); }, 300); }
    document.dispatchEvent(new CustomEvent("live:applied"));
  }

  window.live = {
    apply: apply,
    // steer.js: send(form, start) runs start() (which issues the form's request) with the form named.
    send: function (form, start) {
      sendingForm = form;
      try { return start(); } finally { sendingForm = null; }
    }
  };

  document.addEventListener("htmx:afterRequest", function () {
    Array.prototype.forEach.call(document.querySelectorAll("form.stale"), function (form) {
      if (!typingIn(form)) form.remove();
    });
  });

  // A decision that cannot reach the server says so at its button (issue 50), not only in the banner: htmx sends a
  // request once and never again by itself, so nothing is applied later by surprise; the page shows the current
  // state again when the live connection is back (the server sends it on every connect).
  var NOT_SENT = "Not sent: the server cannot be reached. Nothing was decided by this click; try again when the connection is back.";
  var FAILED = "The server could not take this decision (error {status}). Look at the current state before trying again.";

  // Decisions sent from the page (steer.js: htmx.ajax with the body as source) name their form here while htmx
  // starts the request, so that its answer, or its failure, is told at that form.
  var sendingForm = null;
  var formOfRequest = typeof WeakMap === "function" ? new WeakMap() : null;

  function decisionForm(evt) {
    var detail = evt.detail || {};
    var elt = detail.elt;
    var form = elt && elt.closest ? elt.closest("form") : null;
    if (!form && formOfRequest && detail.xhr) form = formOfRequest.get(detail.xhr) || null;
    return form;
  }

  document.addEventListener("htmx:beforeSend", function (evt) {
    if (sendingForm && formOfRequest && evt.detail && evt.detail.xhr) formOfRequest.set(evt.detail.xhr, sendingForm);
  });

  function decisionError(evt, text) {
    var form = decisionForm(evt);
    if (!form) return;
    var note = form.querySelector(".decide-error");
    if (!note) {
      note = document.createElement("span");
      note.className = "decide-error error small";
      note.setAttribute("role", "alert");
      form.appendChild(note);
    }
    note.textContent = text;
    Array.prototype.forEach.call(form.querySelectorAll("button"), function (b) { b.disabled = false; });
  }

  document.addEventListener("htmx:sendError", function (evt) { decisionError(evt, NOT_SENT); });
  document.addEventListener("htmx:timeout", function (evt) { decisionError(evt, NOT_SENT); });
  document.addEventListener("htmx:responseError", function (evt) {
    var xhr = evt.detail && evt.detail.xhr;
    decisionError(evt, FAILED.replace("{status}", xhr ? String(xhr.status) : "unknown"));
  });
  document.addEventListener("htmx:beforeRequest", function (evt) {
    var form = decisionForm(evt);
    var note = form && form.querySelector(".decide-error");
    if (note) note.remove();
  });

  // Responses to the operator's own decisions carry sections too (hx-swap-oob): merged the same way.
  document.addEventListener("htmx:oobBeforeSwap", function (evt) {
    var target = evt.detail.target;
    var neu = evt.detail.fragment && evt.detail.fragment.firstElementChild;
    if (!target || !neu || !target.id || neu.id !== target.id) return;
    evt.detail.shouldSwap = false;
    morph(target, neu);
    processed(target);
  });

  if (!root) return;
  var url = (location.protocol === "https:" ? "wss://" : "ws://") + location.host + root.getAttribute("data-live");
  var failures = 0;
  var timer = null;

  function retry(delay) {
    clearTimeout(timer);
    timer = setTimeout(connect, delay);
  }

  function connect() {
    var socket;
    try { socket = new WebSocket(url); } catch (e) { failures++; retry(1000); return; }
    var opened = false;
    socket.onopen = function () { opened = true; };
    socket.onmessage = function (evt) {
      if (typeof evt.data !== "string") return;
      if (opened && failures >= 0) { failures = 0; status("on", "Live"); warn(""); }
      apply(evt.data);
    };
    socket.onclose = function (evt) {
      if (evt.code === 4000) { status("off", "Catching up…"); retry(0); return; }
      if (evt.code === 4401) { status("off", "Logged out: reload the page to log in again"); warn("Logged out: reload the page to log in again"); return; }
      if (evt.code === 4404) { status("off", "This page no longer exists"); warn("This page no longer exists"); return; }
      failures++;
      // 0.5 s, 1 s, 2 s … up to 10 s, with jitter so many pages do not come back all at once.
      var delay = Math.min(10000, 500 * Math.pow(2, Math.min(failures - 1, 5))) * (0.75 + Math.random() / 2);
      status("off", evt.code === 4503 ? "Live updates unavailable; retrying…" : "Reconnecting…");
      warn(DISCONNECTED);
      retry(delay);
    };
  }

  connect();
})();
