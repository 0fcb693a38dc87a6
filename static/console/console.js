/* safestop console: live regions, relative times, one-submit forms.
 *
 * Live updates. A `.live-root` element opens a websocket through htmx's ws extension
 * (`hx-ext="ws" ws-connect="/ws/runs/..."`). The server sends small JSON frames
 *   {"type": "run.updated", "run_id", "team", "status", "stop_epoch", "seq", "kind"}
 * — never HTML — and this script decides which regions to refetch. Each region is a
 * `[data-live]` element with a `data-live-url`; it is refetched with htmx (the server answers
 * with the `{% partialdef %}` fragment matching the HX-Target id) and morphed into place with
 * idiomorph's htmx extension (`morph` swap, static/console/vendor/), out-of-band parts too: the
 * nodes that did not change stay the same nodes, so the focus, a selection, the scroll position,
 * open <details>, typed text and messages (`data-flash`) survive a refresh.
 *   data-live="always"  refetch on every frame, unless its data-seq shows it is already newer
 *   data-live="status"  refetch only when the run's status or epoch differs from what it shows
 *   data-live="guarded" refetch unless the user is typing in it; then show a "changed" notice
 * A region with data-live-via="<id>" data-live-part="<name>" is not fetched on its own: it rides
 * out of band on the response of region <id> (the run's actions change with its summary).
 * Each region fetches itself with htmx (hx-get, hx-trigger="safestop:refresh", hx-sync="this:queue
 * last"): frames arriving while a request is in flight coalesce into one trailing fetch, so a
 * burst of changes costs two requests (a filtered region orders its answers itself, below).
 * Frames are at most once (Redis Pub/Sub, console/settings.py): when a run's `seq` skips a
 * number, a frame was lost, and every region showing that run refetches whatever the frame says.
 * After a reconnect every region is refetched (frames sent while offline are not replayed).
 */
(function () {
  "use strict";
  // Strings go through Django's JavaScript catalog (the page loads /jsi18n/ first); without it
  // (a test page that loads only this file) they stay English.
  var gettext = window.gettext || function (text) { return text; };
  var interpolate = window.interpolate || function (format, values) {
    return format.replace(/%\((\w+)\)s/g, function (_m, name) { return String(values[name]); });
  };

  // A region fetches itself, declaratively (its template says so):
  //   hx-get="<its url>" hx-trigger="safestop:refresh" hx-sync="this:queue last"
  //   hx-swap="morph" hx-disinherit="*"
  // `queue last` keeps at most one request in flight and one waiting: a burst of frames costs
  // two requests and the last state still wins. What htmx cannot say stays here: which frames
  // concern a region (below), the parts riding along (`?with=`), and waiting for a person's own
  // request for the region.
  // `part`: another region to bring along out of band (`?with=actions`), so regions that
  // depend on one another change in the same swap.
  var LIVE_EVENT = "safestop:refresh";
  function refresh(id, part) {
    var el = document.getElementById(id);
    if (!el || !el.hasAttribute("hx-get")) return;
    if (part) (el.safestopParts || (el.safestopParts = {}))[part] = true;
    // A person's own request for this region is under way: it carries what they asked for, so
    // the live fetch starts after its answer (see queryRegion below).
    if (userGets[id] > 0) { heldLive[id] = true; return; }
    htmx.trigger(el, LIVE_EVENT);
  }

  function isLiveRequest(detail) {
    var event = detail && (detail.triggeringEvent || (detail.requestConfig && detail.requestConfig.triggeringEvent));
    return !!event && event.type === LIVE_EVENT;
  }

  // A live request says so (the server and the swap below tell it from a person's own), and
  // carries the parts asked for since the last one.
  document.addEventListener("htmx:configRequest", function (evt) {
    var detail = evt.detail;
    if (!isLiveRequest(detail)) return;
    detail.headers["X-Safestop-Live"] = "1";
    var parts = detail.elt.safestopParts ? Object.keys(detail.elt.safestopParts) : [];
    detail.elt.safestopParts = null;
    if (parts.length) detail.parameters["with"] = parts.join(",");
  });

  // A live refresh morphs rather than replaces (a replaced node takes the focus with it: tabbing
  // into a table that refreshes every second never reached its rows). `liveSwap` says whether
  // the swap under way is one: set for every swap, so a person's own request never inherits it.
  var liveSwap = false;
  document.addEventListener("htmx:beforeSwap", function (evt) {
    var config = evt.detail.requestConfig;
    liveSwap = !!(config && config.headers && config.headers["X-Safestop-Live"]);
    // The regions riding along out of band morph as well (the templates say
    // hx-swap-oob="true", which would replace them).
    if (liveSwap && typeof evt.detail.serverResponse === "string") {
      evt.detail.serverResponse = evt.detail.serverResponse.replace(/ hx-swap-oob="true"/g, ' hx-swap-oob="morph"');
    }
  });
  if (window.Idiomorph) {
    // A value someone is typing into the focused field stays theirs. (Not idiomorph's
    // ignoreActiveValue: it skips the children of any focused element, and after a Stop the
    // focus rests on the run's status, which must still change.)
    Idiomorph.defaults.callbacks.beforeNodeMorphed = function (node) {
      return !(liveSwap && node === document.activeElement && /^(INPUT|TEXTAREA|SELECT)$/.test(node.tagName));
    };
    // A message (`data-flash`: "Approved as it was…") is the answer to what the person did: a
    // live refresh, rendered without it, must not take it away. A person's own next request
    // replaces its region and the message with it.
    // A refresh that drops the message's container as a whole (the group whose last approval
    // was just decided is no longer rendered) would take the message with it: the container
    // stays, holding the message alone.
    Idiomorph.defaults.callbacks.beforeNodeRemoved = function (node) {
      if (!liveSwap || node.nodeType !== 1) return true;
      if (node.hasAttribute("data-flash")) return false;
      if (!node.querySelector("[data-flash]")) return true;
      keepOnlyFlash(node);
      return false;
    };
    // An open confirmation or dialog stays open (the server renders it closed).
    Idiomorph.defaults.callbacks.beforeAttributeUpdated = function (name, node) {
      return !(liveSwap && name === "open" && /^(DETAILS|DIALOG)$/.test(node.tagName));
    };
  }

  function keepOnlyFlash(node) {
    Array.prototype.slice.call(node.children).forEach(function (child) {
      if (child.hasAttribute("data-flash")) return;
      if (child.querySelector("[data-flash]")) keepOnlyFlash(child);
      else child.remove();
    });
  }

  // A filtered region (data-query-form="<form id>", the runs table) shows what that form asks
  // for, and the form is the one place the query lives:
  // - every GET that swaps the region carries the form's current values (a live refresh, the
  //   pager; the form's own request serialises itself); a changed filter drops the page cursor;
  // - the answer to a person's newest GET is always swapped in: it is what they asked for (the
  //   query and the page), and its swap is what puts that query in the address bar;
  // - any other answer is swapped only if it left after that GET and nothing newer is shown:
  //   one that left before carries an older query or page, one older than the rows on screen
  //   would move the table back. Dropping is by that order alone, never "only the newest
  //   issued": `queue last` does not keep a region to one request in flight (a morph that
  //   changes the region's hx-get re-initialises it and htmx forgets the request under way),
  //   so refreshes overlap, and under a steady stream of frames every answer would be
  //   overtaken before it landed and the table would never change again;
  // - a live fetch waits while a person's own GET for the region is in flight.
  var PAGE_PARAMS = ["after", "before"];
  var issued = {}; // region id -> number of the newest GET issued for it
  var shown = {}; // region id -> number of the GET whose answer the region shows
  var userGets = {}; // region id -> GETs a person started, in flight
  var heldLive = {}; // region id -> a live fetch waits for them
  var newestUser = {}; // region id -> the issue number of the newest GET a person started

  function queryRegion(target) {
    return target && target.dataset && target.dataset.queryForm && target.id ? target : null;
  }

  function withFormQuery(path, form) {
    var url = new URL(path, window.location.href);
    var params = url.searchParams;
    var data = new FormData(form);
    var changed = false;
    var seen = {};
    for (var i = 0; i < form.elements.length; i++) {
      var name = form.elements[i].name;
      if (!name || seen[name]) continue;
      seen[name] = true;
      var value = String(data.get(name) || "");
      if ((params.get(name) || "") !== value) changed = true;
      if (value) params.set(name, value); else params.delete(name);
    }
    if (changed) PAGE_PARAMS.forEach(function (name) { params.delete(name); });
    var query = params.toString();
    return url.pathname + (query ? "?" + query : "");
  }

  document.addEventListener("htmx:configRequest", function (evt) {
    var detail = evt.detail;
    var region = queryRegion(detail.target);
    if (!region || String(detail.verb).toLowerCase() !== "get") return;
    var form = document.getElementById(region.dataset.queryForm);
    if (form && detail.elt !== form) detail.path = withFormQuery(detail.path, form);
  });

  document.addEventListener("htmx:beforeRequest", function (evt) {
    var detail = evt.detail;
    var region = queryRegion(detail.target);
    if (!region || !detail.xhr || isWrite(evt)) return;
    var id = region.id;
    issued[id] = (issued[id] || 0) + 1;
    detail.xhr.safestopRegion = id;
    detail.xhr.safestopIssued = issued[id];
    var headers = (detail.requestConfig && detail.requestConfig.headers) || {};
    if (!headers["X-Safestop-Live"]) {
      detail.xhr.safestopUser = true;
      userGets[id] = (userGets[id] || 0) + 1;
      newestUser[id] = issued[id];
    }
  });

  document.addEventListener("htmx:beforeSwap", function (evt) {
    var xhr = evt.detail.xhr;
    var id = xhr && xhr.safestopRegion;
    if (!id) return;
    var n = xhr.safestopIssued;
    var isNewestUser = n === newestUser[id];
    if (n < (newestUser[id] || 0) || (!isNewestUser && n < (shown[id] || 0))) {
      evt.detail.shouldSwap = false;
      return;
    }
    if (evt.detail.shouldSwap) shown[id] = n;
  });

  // Only the person's newest GET for a query region moves the address bar. Its answer is always
  // swapped (above), so htmx pushes its URL; every other answer must not. The check above cannot
  // stop all of those: an answer aimed at a region a later answer replaced fires htmx:beforeSwap
  // on the detached node, which never reaches the document, and htmx would still push its URL
  // (a pager click overtaken by a search). This event is fired on <body> for every push.
  document.addEventListener("htmx:beforeHistoryUpdate", function (evt) {
    var xhr = evt.detail.xhr;
    var id = xhr && xhr.safestopRegion;
    if (!id || (xhr.safestopUser && xhr.safestopIssued === newestUser[id])) return;
    evt.detail.history.type = "replace";
    evt.detail.history.path = location.pathname + location.search + location.hash;
  });

  document.addEventListener("htmx:afterRequest", function (evt) {
    var xhr = evt.detail.xhr;
    if (!xhr || !xhr.safestopUser || xhr.safestopDone) return;
    xhr.safestopDone = true; // afterRequest may fire twice (on the element and its parent)
    var id = xhr.safestopRegion;
    userGets[id] = Math.max(0, (userGets[id] || 0) - 1);
    if (!userGets[id] && heldLive[id]) {
      heldLive[id] = false;
      refresh(id);
    }
  });

  // A filter chip (the runs page's state pills) sets its field in the form and submits it, so
  // the form stays the one copy of the query. Without script it is a plain link.
  document.addEventListener("click", function (evt) {
    var chip = evt.target.closest && evt.target.closest("[data-filter-field]");
    if (!chip || evt.button || evt.ctrlKey || evt.metaKey || evt.shiftKey || evt.altKey) return;
    var form = document.getElementById(chip.dataset.filterForm);
    var field = form && form.elements[chip.dataset.filterField];
    if (!field || !form.requestSubmit) return;
    evt.preventDefault();
    field.value = chip.dataset.filterValue || "";
    form.requestSubmit();
  });

  function refreshRegion(el) {
    if (el.dataset.liveVia) refresh(el.dataset.liveVia, el.dataset.livePart);
    else refresh(el.id);
  }

  function isBusyTyping(el) {
    var active = document.activeElement;
    if (active && el.contains(active) && /^(INPUT|TEXTAREA|SELECT)$/.test(active.tagName)) return true;
    var fields = el.querySelectorAll("textarea, input[type=text]");
    for (var i = 0; i < fields.length; i++) { if (fields[i].value) return true; }
    var open = el.querySelectorAll("details[open]");
    return open.length > 0;
  }

  var FILTERS = {
    handoff: function (msg) {
      var kind = msg.kind || "";
      return kind.indexOf("handoff") === 0 || kind.indexOf("steering") === 0 || msg.status === "handed_off" ||
        kind === "run.handed_off" || kind === "run.closed" || kind.indexOf("run.returned") === 0;
    },
    // The inbox changes when an approval does; a stop or an interruption voids what waits, so
    // every status change passes too.
    approvals: function (msg) {
      return (msg.kind || "").indexOf("approval") === 0 || msg.status !== "running";
    },
    // Needs me: approvals and handoffs come and go with their own changes; a dirty stop or an
    // interrupted run's unknowns with any change of a run that is neither running nor pending.
    needs: function (msg) {
      var kind = msg.kind || "";
      return kind.indexOf("approval") === 0 || kind.indexOf("handoff") === 0 ||
        (msg.status !== "running" && msg.status !== "pending");
    }
  };

  var recentlyChanged = {};
  var statusLabels = {
    pending: gettext("pending"), running: gettext("running"), suspended: gettext("suspended"),
    interrupted: gettext("interrupted"), cancel_requested: gettext("cancel requested"),
    draining: gettext("draining"), stopped_cleanly: gettext("stopped cleanly"),
    stopped_dirty: gettext("stopped dirty"), handed_off: gettext("handed off"),
    completed: gettext("completed"), failed: gettext("failed"), cancelled: gettext("cancelled")
  };

  function announce(text) {
    var box = document.getElementById("live-announcer");
    if (box) { box.textContent = text; }
  }

  // The highest seq seen per run: a frame more than one past it means frames were lost.
  var lastSeq = {};

  function sawGap(msg) {
    var seq = Number(msg.seq), last = lastSeq[msg.run_id];
    if (isNaN(seq)) return false;
    if (last === undefined || seq > last) lastSeq[msg.run_id] = seq;
    return last !== undefined && seq > last + 1;
  }

  function onFrame(root, msg) {
    if (!msg || msg.type !== "run.updated") return;
    recentlyChanged[msg.run_id] = Date.now();
    // The navigation's counts refetch themselves on this event (base.html: hx-trigger with a
    // delay, so a burst of frames costs one request).
    htmx.trigger(document.body, "safestop:frame");
    var scopeRun = root.dataset.runId;
    if (scopeRun && scopeRun !== msg.run_id) return;
    // A lost frame may have been the one a filter or a status check would have let through.
    var gap = sawGap(msg);
    // Regions that ride on another go first, so their part joins that region's next fetch.
    var nodes = Array.prototype.slice.call(root.querySelectorAll("[data-live]"));
    nodes.sort(function (a, b) { return (b.dataset.liveVia ? 1 : 0) - (a.dataset.liveVia ? 1 : 0); });
    for (var i = 0; i < nodes.length; i++) {
      var el = nodes[i];
      var mode = el.dataset.live;
      if (!gap && el.dataset.liveFilter && FILTERS[el.dataset.liveFilter] && !FILTERS[el.dataset.liveFilter](msg)) continue;
      // Already showing this change or a newer one (a frame can arrive after our own POST's answer):
      // the region itself is about one run, or it shows that run in a row or card that says its seq.
      if (el.dataset.seq && el.dataset.runId === msg.run_id && Number(msg.seq) <= Number(el.dataset.seq)) continue;
      // A region listing some runs only (a bulk stop's results: data-live-listed) ignores the
      // frames of every other run of the team.
      if (el.dataset.liveListed && window.CSS && CSS.escape &&
          !el.querySelector('[data-run-id="' + CSS.escape(String(msg.run_id)) + '"]')) continue;
      if (!el.dataset.seq && window.CSS && CSS.escape) {
        var shown = el.querySelector('[data-run-id="' + CSS.escape(String(msg.run_id)) + '"][data-seq]');
        if (shown && Number(msg.seq) <= Number(shown.dataset.seq)) continue;
      }
      if (!gap && mode === "status" && el.dataset.status === msg.status &&
          String(el.dataset.epoch) === String(msg.stop_epoch)) continue;
      if (mode === "guarded" && isBusyTyping(el)) {
        var notice = el.querySelector(".stale-notice");
        if (notice) notice.hidden = false;
        continue;
      }
      if (mode === "status" && scopeRun && el.dataset.status !== msg.status) {
        announce(interpolate(gettext("Run is now %(status)s"), { status: statusLabels[msg.status] || msg.status }, true));
      }
      refreshRegion(el);
    }
  }

  function refreshAll(root) {
    var nodes = root.querySelectorAll("[data-live]");
    for (var i = 0; i < nodes.length; i++) refreshRegion(nodes[i]);
  }

  function setIndicator(state, text) {
    var nodes = document.querySelectorAll("[data-live-indicator]");
    for (var i = 0; i < nodes.length; i++) {
      nodes[i].dataset.state = state;
      var label = nodes[i].querySelector(".live-indicator__text");
      if (label) label.textContent = text;
    }
  }

  var opened = new WeakSet();

  // While one of our own POSTs is in flight, frames wait: the change it made is announced the
  // moment it commits, before its answer arrives, and refetching then would overwrite the
  // answer (and its message). Once the answer is swapped in, the waiting frames are replayed
  // and most are skipped by their sequence number.
  var posting = 0;
  var deferred = [];

  function isWrite(evt) {
    var config = evt.detail && evt.detail.requestConfig;
    return !!config && String(config.verb).toLowerCase() !== "get";
  }
  document.addEventListener("htmx:beforeRequest", function (evt) { if (isWrite(evt)) posting += 1; });
  document.addEventListener("htmx:afterRequest", function (evt) {
    if (!isWrite(evt) || posting === 0) return;
    posting -= 1;
    if (posting === 0) {
      var waiting = deferred;
      deferred = [];
      for (var i = 0; i < waiting.length; i++) onFrame(waiting[i][0], waiting[i][1]);
    }
  });

  document.addEventListener("htmx:wsBeforeMessage", function (evt) {
    // Frames are JSON, not HTML: handle them here and stop the extension from swapping.
    evt.preventDefault();
    var msg;
    try { msg = JSON.parse(evt.detail.message); } catch (e) { return; }
    var root = evt.target.closest ? evt.target.closest(".live-root") || evt.target : evt.target;
    if (posting > 0) { deferred.push([root, msg]); return; }
    onFrame(root, msg);
  });

  document.addEventListener("htmx:wsOpen", function (evt) {
    var root = evt.target;
    setIndicator("live", gettext("live"));
    if (opened.has(root)) refreshAll(root); // a reconnect: catch up on what we missed
    opened.add(root);
    root.dataset.wsState = "open";
  });

  document.addEventListener("htmx:wsClose", function (evt) {
    var code = evt.detail && evt.detail.event ? evt.detail.event.code : 0;
    evt.target.dataset.wsState = "closed";
    if (code === 4401) {
      // The session ended (logout elsewhere, password change): reload once, which lands on the
      // login page, or — after a password change in this browser — reconnects with the new
      // session. At most once a minute, so a socket that keeps refusing cannot loop the page.
      var last = Number(window.sessionStorage.getItem("safestop-reload-4401") || 0);
      if (Date.now() - last > 60000) {
        window.sessionStorage.setItem("safestop-reload-4401", String(Date.now()));
        setIndicator("off", gettext("signed out — reloading"));
        window.location.reload();
        return;
      }
      setIndicator("off", gettext("not live (signed out)"));
    } else if (code === 4403 || code === 1000) {
      setIndicator("off", code === 1000 ? gettext("not live") : gettext("not live (no access)"));
    } else {
      setIndicator("reconnecting", gettext("reconnecting…"));
    }
  });

  document.addEventListener("htmx:wsError", function () { setIndicator("reconnecting", gettext("reconnecting…")); });

  // Flash the rows of the runs table that just changed.
  document.addEventListener("htmx:afterSettle", function (evt) {
    var target = evt.detail && evt.detail.elt;
    if (!target || !target.querySelectorAll) return;
    var now = Date.now();
    var rows = document.querySelectorAll("#runs-region tr[data-run-id]");
    for (var i = 0; i < rows.length; i++) {
      var at = recentlyChanged[rows[i].dataset.runId];
      if (at && now - at < 1500) rows[i].classList.add("flash");
    }
    tick();
  });

  // Relative times ("12 s ago") and countdowns ("in 24 s") stay current without a request.
  function ageText(seconds) {
    if (seconds < 1) return gettext("just now");
    if (seconds < 60) return interpolate(gettext("%(n)s s ago"), { n: Math.floor(seconds) }, true);
    if (seconds < 3600) return interpolate(gettext("%(n)s min ago"), { n: Math.floor(seconds / 60) }, true);
    if (seconds < 86400) return interpolate(gettext("%(n)s h ago"), { n: Math.floor(seconds / 3600) }, true);
    return interpolate(gettext("%(n)s d ago"), { n: Math.floor(seconds / 86400) }, true);
  }

  // "in 24 s", "in 14 min 29 s", "in 2 h 5 min": approval deadlines run to minutes and hours.
  function leftText(seconds) {
    var s = Math.ceil(seconds);
    if (s < 60) return interpolate(gettext("in %(s)s s"), { s: s }, true);
    if (s < 3600) return interpolate(gettext("in %(min)s min %(s)s s"), { min: Math.floor(s / 60), s: s % 60 }, true);
    return interpolate(gettext("in %(h)s h %(min)s min"), { h: Math.floor(s / 3600), min: Math.floor((s % 3600) / 60) }, true);
  }

  function tick() {
    var now = Date.now();
    var ages = document.querySelectorAll("time[data-ago]");
    for (var i = 0; i < ages.length; i++) {
      var t = Date.parse(ages[i].getAttribute("datetime"));
      if (!isNaN(t)) ages[i].textContent = ageText(Math.max(0, (now - t) / 1000));
    }
    var downs = document.querySelectorAll("time[data-countdown]");
    for (var j = 0; j < downs.length; j++) {
      var end = Date.parse(downs[j].getAttribute("datetime")) + 1000 * Number(downs[j].dataset.offset || 0);
      if (isNaN(end)) continue;
      var left = (end - now) / 1000;
      downs[j].textContent = left > 0 ? leftText(left) : interpolate(gettext("passed, %(ago)s"), { ago: ageText(-left) }, true);
      downs[j].classList.toggle("is-late", left <= 0);
    }
  }

  // Without htmx (or for plain forms), a second click must not post twice: the button is
  // disabled once the first submit is under way. The server is idempotent anyway.
  document.addEventListener("submit", function (evt) {
    var form = evt.target;
    if (!form.hasAttribute || !form.hasAttribute("data-once") || form.hasAttribute("hx-post")) return;
    setTimeout(function () {
      var buttons = form.querySelectorAll("button[type=submit]");
      for (var i = 0; i < buttons.length; i++) buttons[i].disabled = true;
    }, 0);
  });

  document.addEventListener("click", function (evt) {
    var el = evt.target.closest && evt.target.closest("[data-print]");
    if (el) { window.print(); }
    // A secret shown once (a new token, a signing secret): one click selects all of it to copy.
    // Here rather than an inline onclick, which the Content-Security-Policy refuses.
    if (evt.target.matches && evt.target.matches("input.token-raw")) { evt.target.select(); }
    var reload = evt.target.closest && evt.target.closest("[data-live-reload]");
    if (reload) {
      var region = reload.closest("[data-live]");
      if (region) { evt.preventDefault(); refresh(region.id); }
    }
  });

  // A session that ended: htmx would follow the redirect and swap the login form into a
  // region. Go to the login page instead.
  document.addEventListener("htmx:beforeSwap", function (evt) {
    var url = (evt.detail.xhr && evt.detail.xhr.responseURL) || "";
    if (url.indexOf("/login/") !== -1 && location.pathname.indexOf("/login/") !== 0) {
      evt.detail.shouldSwap = false;
      window.location.href = url;
    }
  });

  // A select that reveals fields for one of its values (the quality page: From and To only for
  // "Custom"). Hidden fields are disabled too, so a preset never travels with stale dates. In the
  // capture phase, before htmx's own listener sends the form on the same change; choosing the
  // revealing value sends nothing (the fields it shows are empty: the person fills them first).
  document.addEventListener("change", function (evt) {
    var select = evt.target;
    if (!select.matches || !select.matches("select[data-reveals]")) return;
    var show = select.value === select.dataset.revealsWhen;
    var boxes = document.querySelectorAll(select.dataset.reveals);
    for (var i = 0; i < boxes.length; i++) {
      boxes[i].hidden = !show;
      var fields = boxes[i].querySelectorAll("input, select, textarea");
      for (var j = 0; j < fields.length; j++) fields[j].disabled = !show;
    }
    if (show) evt.stopPropagation();
  }, true);

  // A refused or failed request is said out loud, not silently dropped.
  function toast(text) {
    var box = document.getElementById("toast");
    if (!box) {
      box = document.createElement("div");
      box.id = "toast";
      box.className = "toast";
      box.setAttribute("role", "alert");
      document.body.appendChild(box);
    }
    box.textContent = text;
    box.hidden = false;
    clearTimeout(box._timer);
    box._timer = setTimeout(function () { box.hidden = true; }, 8000);
  }
  // A write that did not go through is said next to its button, with a button that sends it
  // again (`data-action-name` on the form names it: "stop"). Never "retrying" when nothing is.
  function sayNotDone(evt, status) {
    if (!isWrite(evt)) return false;
    var elt = evt.detail.elt;
    var form = elt && (elt.tagName === "FORM" ? elt : elt.closest && elt.closest("form"));
    if (!form || !document.body.contains(form)) return false;
    var what = form.dataset.actionName || "request";
    var What = what.charAt(0).toUpperCase() + what.slice(1);
    var text = status
      ? "The " + what + " may not have been recorded: the server answered " + status + ". Sending it again is safe."
      : What + " not sent: the server could not be reached" +
        (what === "stop" ? ", so the run has not been told to stop." : ". Nothing was changed.");
    var note = form.querySelector(".send-failed");
    if (!note) {
      note = document.createElement("div");
      note.className = "send-failed note note--bad";
      note.setAttribute("role", "alert");
      var submit = form.querySelector("button[type=submit]");
      if (submit) submit.insertAdjacentElement("afterend", note); else form.appendChild(note);
    }
    note.textContent = "";
    var line = document.createElement("span");
    line.textContent = text;
    var retry = document.createElement("button");
    retry.type = "button";
    retry.className = "btn btn--small";
    retry.setAttribute("data-retry-send", "");
    retry.textContent = "Retry " + what;
    note.appendChild(line);
    note.appendChild(retry);
    return true;
  }
  document.addEventListener("click", function (evt) {
    var retry = evt.target.closest && evt.target.closest("[data-retry-send]");
    var form = retry && retry.closest("form");
    if (!form) return;
    var note = retry.closest(".send-failed");
    if (note) note.parentNode.removeChild(note);
    if (form.requestSubmit) form.requestSubmit(form.querySelector("button[type=submit]") || undefined);
  });
  document.addEventListener("htmx:responseError", function (evt) {
    var status = evt.detail.xhr ? evt.detail.xhr.status : 0;
    if (status >= 500 && sayNotDone(evt, status)) return;
    toast(status === 403 ? "Not allowed: your role does not permit this." :
          status === 404 ? "Not found: it may belong to a team you are not in." :
          "The server could not do that (" + status + "). Reload the page and try again.");
  });
  document.addEventListener("htmx:sendError", function (evt) {
    if (sayNotDone(evt, 0)) return;
    toast("The server could not be reached: that request was not sent.");
  });

  // After an action that changes the run's state (Stop), focus goes to the new status rather
  // than to the page body (the form that held it was swapped out): a keyboard or screen-reader
  // user hears what happened and continues from there. Once, for that request's own swap.
  var focusAfter = null;
  document.addEventListener("htmx:beforeRequest", function (evt) {
    var elt = evt.detail && evt.detail.elt;
    if (elt && elt.dataset && elt.dataset.focusAfter) focusAfter = elt.dataset.focusAfter;
  });
  document.addEventListener("htmx:afterSettle", function () {
    if (!focusAfter) return;
    var target = document.querySelector(focusAfter);
    focusAfter = null;
    if (target) target.focus();
  });
  // A request that got no swap (unreachable server, an error status) moves no focus later.
  document.addEventListener("htmx:sendError", function () { focusAfter = null; });
  document.addEventListener("htmx:responseError", function () { focusAfter = null; });

  // Escape closes the confirmation (Stop…, Take over…, Close…) that holds the focus, and puts
  // the focus back on the button that opened it, as a dialog would.
  document.addEventListener("keydown", function (evt) {
    if (evt.key !== "Escape" || !evt.target.closest) return;
    var open = evt.target.closest("details[open]");
    if (!open) return;
    evt.preventDefault();
    open.open = false;
    var summary = open.querySelector("summary");
    if (summary) summary.focus();
  });

  // A printed stop packet carries its raw JSON too.
  window.addEventListener("beforeprint", function () {
    var raw = document.querySelectorAll("details.raw-json");
    for (var i = 0; i < raw.length; i++) raw[i].open = true;
  });

  document.addEventListener("DOMContentLoaded", function () {
    tick();
    setInterval(tick, 1000);
  });
})();
