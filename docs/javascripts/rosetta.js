// The side-by-side tab sets (<div class="rosetta" data-impls="KEY ...">, made by
// docs_build/tabs.py) and the reader's choice of what they show.
//
// - The view: two implementations, in the order picked ("pair"; at first Flax Linen against
//   Flax NNX), or every one of them (columns on a wide screen, linked tabs on a narrow one). A
//   control above the first tab set of a page picks it. The choice is in the address (?a=KEY&b=KEY
//   for a pair), so a link opens the same view, and in localStorage, so the next page opens with
//   it too. The compare page (whole files, <div class="rosetta-compare">) always shows a pair,
//   and under each section's heading the chosen pair's contrast line and only the two chosen
//   implementations' notes on what differs; a name in the address that is no implementation is
//   said so.
// - Lines never break inside a name. Where lines wrap (every view but a pair's two columns: the
//   CSS), they break only at spaces, after an opening bracket, a comma or "=", and before a dot;
//   a token without a space in it is never split, and a continuation hangs four characters right
//   of the line's own indentation (--hang; the indentation itself never wraps). The text is
//   unchanged, so copying the code still copies it exactly.
// - --rosetta-top: where the sticky column labels stop, below the header (and below the compare
//   page's own sticky control).
(function () {
  const STORE = "rosetta.view";
  const COMPARE_DEFAULT = { a: "flax_linen", b: "flax_nnx" };

  // --- lines that break only between tokens --------------------------------------------------

  function hang(line) {
    const walker = document.createTreeWalker(line, NodeFilter.SHOW_TEXT);
    let indent = 0;
    const spaces = [];
    for (let node = walker.nextNode(); node; node = walker.nextNode()) {
      const lead = node.data.length - node.data.replace(/^ +/, "").length;
      if (lead > 0) {
        spaces.push(lead < node.data.length ? node.splitText(lead) && node : node);
        indent += lead;
      }
      if (lead < node.data.length) break;
    }
    for (const node of spaces) {
      const wrap = document.createElement("span");
      wrap.className = "rosetta-indent";
      node.parentNode.insertBefore(wrap, node);
      wrap.appendChild(node);
    }
    line.dataset.indent = indent;
    line.dataset.hangCh = indent + 4;
    line.style.setProperty("--hang", indent + 4 + "ch");
  }

  // Where a wrapped line still overflows its column (a token longer than the room its hang
  // leaves, as in six narrow columns), its continuation hangs less, down to two characters right
  // of the line's own code: the line stays in view, no token is split, and a continuation still
  // reads as one. Measured once for all lines, then for those that overflow, step by step.
  function fitHangs() {
    const lines = [...document.querySelectorAll(".rosetta code > span[data-hang-ch]")];
    for (const line of lines) line.style.setProperty("--hang", line.dataset.hangCh + "ch");
    const over = lines.filter(
      (line) => line.offsetParent !== null && line.scrollWidth > line.clientWidth + 1,
    );
    for (const line of over) {
      for (let hang = +line.dataset.hangCh - 1; hang >= +line.dataset.indent + 2; hang -= 1) {
        line.style.setProperty("--hang", hang + "ch");
        if (line.scrollWidth <= line.clientWidth + 1) break;
      }
    }
  }

  // Where a long line may break besides its spaces: after an opening bracket, a comma or "=",
  // and before a dot; inside comments and strings (Pygments' classes c* and s*, which may quote
  // code or a path) also after a slash. Any other token is never split.
  const BREAK_AFTER = /[([{,=]$/;
  const BREAK_INSIDE = /[([{,=/](?=\S)|[A-Za-z_\])](?=\.[A-Za-z_])/g; // not inside "31.6"

  function allowBreaks(line) {
    const tokens = [...line.children].filter((t) => t.className !== "rosetta-indent");
    tokens.forEach((token, i) => {
      if (/^[cs]/.test(token.className)) breakInside(token);
      // a token without a space is never split, a string's included ("dm-haiku" breaks at no
      // hyphen); a comment's or a string's <wbr>s still let it break
      if (!/\s/.test(token.textContent)) token.classList.add("rosetta-token");
      const next = tokens[i + 1];
      if (
        next &&
        token.nextSibling === next &&
        (BREAK_AFTER.test(token.textContent) || next.textContent.startsWith("."))
      ) {
        next.before(document.createElement("wbr"));
      }
    });
  }

  function breakInside(token) {
    const walker = document.createTreeWalker(token, NodeFilter.SHOW_TEXT);
    const nodes = [];
    for (let node = walker.nextNode(); node; node = walker.nextNode()) nodes.push(node);
    for (const node of nodes) {
      const cuts = [...node.data.matchAll(BREAK_INSIDE)].map((m) => m.index + 1);
      for (const cut of cuts.reverse()) node.splitText(cut).before(document.createElement("wbr"));
    }
  }

  function prepareLines() {
    // The copy button copies data-copy when there is one (Material): the code exactly as it is
    // in the file, whatever the wrapping and the alignment's margins do to the rendered text.
    for (const code of document.querySelectorAll(".rosetta pre > code")) {
      if (!code.closest("[data-copy]")) code.dataset.copy = code.textContent;
    }
    for (const line of document.querySelectorAll('.rosetta code > span[id^="__span"]')) {
      if (!line.dataset.hang) {
        line.dataset.hang = "1";
        hang(line);
        allowBreaks(line);
      }
    }
  }

  // --- a pair's corresponding lines, side by side ---------------------------------------------

  // In a pair's two columns, the definitions the two code blocks share (def, class, a top-level
  // name = ...), in the order both have them, start on the same row: space is added above the
  // one that would come first, as the Flax migration guides pad their columns with blank lines.
  const ANCHOR = /^(\s*)(?:async\s+)?(?:def|class)\s+(\w+)|^([A-Za-z_]\w*)\s*(?::[^=]*)?=(?!=)/;

  function anchors(code) {
    const lines = [...code.querySelectorAll(':scope > span[id^="__span"]')];
    const found = [];
    lines.forEach((line, i) => {
      const m = ANCHOR.exec(line.textContent);
      if (!m) return;
      let first = i; // a definition starts at its decorators
      while (first > 0 && /^\s*@/.test(lines[first - 1].textContent)) first -= 1;
      found.push({ key: m[2] ? `def ${m[2]}` : `${m[3]} =`, line: lines[first] });
    });
    return found;
  }

  // The longest run of keys both lists have in the same order (both are short).
  function common(a, b) {
    const n = a.length, m = b.length;
    const best = Array.from({ length: n + 1 }, () => new Array(m + 1).fill(0));
    for (let i = n - 1; i >= 0; i--)
      for (let j = m - 1; j >= 0; j--)
        best[i][j] = a[i].key === b[j].key
          ? best[i + 1][j + 1] + 1 : Math.max(best[i + 1][j], best[i][j + 1]);
    const pairs = [];
    for (let i = 0, j = 0; i < n && j < m; ) {
      if (a[i].key === b[j].key) pairs.push([a[i++].line, b[j++].line]);
      else if (best[i + 1][j] >= best[i][j + 1]) i++;
      else j++;
    }
    return pairs;
  }

  function align() {
    for (const line of document.querySelectorAll(".rosetta-aligned")) {
      line.style.marginTop = "";
      line.classList.remove("rosetta-aligned");
    }
    if (!window.matchMedia("(min-width: 75em)").matches) return; // stacked: nothing to align
    for (const rosetta of document.querySelectorAll('.rosetta[data-view="pair"]')) {
      for (const set of rosetta.querySelectorAll(":scope > .tabbed-set")) {
        const [a, b] = ["a", "b"].map((side) => [
          ...set.querySelectorAll(`:scope > .tabbed-content > [data-side="${side}"] pre > code`),
        ]);
        if (!a.length || a.length !== b.length) continue;
        a.forEach((code, k) => {
          for (const [left, right] of common(anchors(code), anchors(b[k]))) {
            const gap = left.getBoundingClientRect().top - right.getBoundingClientRect().top;
            if (Math.abs(gap) < 0.5) continue;
            const higher = gap > 0 ? right : left;
            higher.classList.add("rosetta-aligned");
            higher.style.marginTop = `${Math.abs(gap)}px`;
          }
        });
      }
    }
  }

  // --- the view --------------------------------------------------------------------------------

  function stored() {
    try {
      return JSON.parse(localStorage.getItem(STORE)) || {};
    } catch (error) {
      return {}; // nothing stored, something unreadable, or storage refused
    }
  }

  function chosen(keys, compare) {
    const valid = (a, b) => keys.includes(a) && keys.includes(b) && a !== b;
    const query = new URLSearchParams(location.search);
    const { view: storedView, a: storedA, b: storedB } = stored();
    const pair = [
      [query.get("a"), query.get("b")],
      [storedA, storedB],
      [COMPARE_DEFAULT.a, COMPARE_DEFAULT.b],
    ].find(([a, b]) => valid(a, b));
    let view = valid(query.get("a"), query.get("b")) ? "pair" : storedView;
    if (compare) view = "pair";
    return { view: view === "all" ? "all" : "pair", a: pair[0], b: pair[1] };
  }

  function show(state, control, compare) {
    for (const rosetta of document.querySelectorAll(".rosetta[data-impls]")) {
      const keys = rosetta.dataset.impls.split(" ");
      rosetta.dataset.view = state.view;
      for (const set of rosetta.querySelectorAll(":scope > .tabbed-set")) {
        const labels = set.querySelectorAll(":scope > .tabbed-labels > label");
        const blocks = set.querySelectorAll(":scope > .tabbed-content > .tabbed-block");
        keys.forEach((key, i) => {
          for (const element of [labels[i], blocks[i]]) {
            if (!element) continue;
            element.dataset.impl = key;
            if (state.view === "pair" && key === state.a) element.dataset.side = "a";
            else if (state.view === "pair" && key === state.b) element.dataset.side = "b";
            else delete element.dataset.side;
          }
        });
      }
    }
    const page = document.querySelector(".rosetta-compare");
    if (page) page.dataset.view = state.view;
    for (const note of document.querySelectorAll(".rosetta-differ[data-impls]")) {
      const keys = note.dataset.impls.split(" ");
      const a = state.view === "pair" && keys.includes(state.a);
      const b = state.view === "pair" && keys.includes(state.b);
      if (a && b) note.dataset.side = "both";
      else if (a || b) note.dataset.side = a ? "a" : "b";
      else delete note.dataset.side;
    }
    for (const line of document.querySelectorAll(".rosetta-contrast[data-pair]")) {
      if (state.view === "pair" && line.dataset.pair === `${state.a} ${state.b}`) {
        line.dataset.shown = "";
      } else delete line.dataset.shown;
    }
    for (const radio of control.querySelectorAll("input[name=view]")) {
      radio.checked = radio.value === state.view;
    }
    control.elements.a.value = state.a;
    control.elements.b.value = state.b;
    const whole = control.querySelector(".rosetta-whole");
    if (whole) whole.href = `${compareUrl()}?a=${state.a}&b=${state.b}`;
    const url = new URL(location.href); // other parameters (the search's ?h=...) stay
    url.searchParams.delete("a");
    url.searchParams.delete("b");
    if (state.view === "pair") {
      url.searchParams.set("a", state.a);
      url.searchParams.set("b", state.b);
    }
    history.replaceState(history.state, "", url);
    fitHangs();
    align();
    try {
      // The compare page always shows a pair: it keeps the pair, not the view, for other pages.
      const view = compare ? stored().view : state.view;
      localStorage.setItem(STORE, JSON.stringify({ ...state, view }));
    } catch (error) {
      // storage refused (private mode): the view still applies to this page
    }
  }

  function compareUrl() {
    const config = document.getElementById("__config");
    const base = config ? JSON.parse(config.textContent).base : ".";
    return new URL(base + "/compare/", location.href).pathname;
  }

  // the words of docs_build/conformance_report.py's NUMBER_WORDS, which the pages' sentences use
  const NUMBERS = ["zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine",
    "ten"];

  function makeControl(keys, labels, compare) {
    const control = document.createElement("form");
    control.className = "rosetta-view";
    control.setAttribute("aria-label", "Implementations shown");
    const options = keys
      .map((key, i) => `<option value="${key}">${labels[i]}</option>`)
      .join("");
    control.innerHTML = `
      ${compare ? "" : `<label><input type="radio" name="view" value="pair"> Two:</label>`}
      <select name="a" aria-label="Left">${options}</select>
      <button type="button" class="rosetta-swap" title="Swap left and right"
        aria-label="Swap left and right">&#8644;</button>
      <select name="b" aria-label="Right">${options}</select>
      ${compare ? "" : `<label><input type="radio" name="view" value="all"> All ${NUMBERS[keys.length] || keys.length}</label>
      <a class="rosetta-whole">the whole files side by side</a>`}`;
    return control;
  }

  function setUpView() {
    const first = document.querySelector(".rosetta[data-impls]");
    if (!first) return;
    const keys = first.dataset.impls.split(" ");
    const labels = [...first.querySelectorAll(".tabbed-labels > label")].map((l) =>
      l.textContent.trim(),
    );
    const compare = document.querySelector(".rosetta-compare") !== null;
    const control = makeControl(keys, labels, compare);
    if (compare) document.querySelector(".rosetta-compare").prepend(control);
    else first.before(control);
    let state = chosen(keys, compare);
    unknownNames(keys, labels, control);
    const update = (change) => {
      state = { ...state, ...change };
      show(state, control, compare);
    };
    const swap = () => update({ view: "pair", a: state.b, b: state.a });
    control.addEventListener("change", (event) => {
      const { name, value } = event.target;
      if (name === "view") update({ view: value });
      else if (value === state[name === "a" ? "b" : "a"]) swap(); // the other list's choice
      else update({ view: "pair", [name]: value });
    });
    control.querySelector(".rosetta-swap").addEventListener("click", swap);
    control.addEventListener("submit", (event) => event.preventDefault());
    show(state, control, compare);
    stickyTop(compare ? control : null);
  }

  // A name in the address that is no implementation is said so, never silently replaced.
  function unknownNames(keys, labels, control) {
    const query = new URLSearchParams(location.search);
    const wrong = ["a", "b"].map((side) => query.get(side)).filter((v) => v && !keys.includes(v));
    if (!wrong.length) return;
    const note = document.createElement("p");
    note.className = "rosetta-unknown";
    note.setAttribute("role", "status");
    const known = keys.map((key, i) => `${key} (${labels[i]})`).join(", ");
    note.textContent = `No implementation named ${wrong.map((w) => `"${w}"`).join(" or ")} ` +
      `(known: ${known}); showing the pair below instead.`;
    control.append(note);
  }

  // The sticky labels stop below Material's header, and on the compare page below its control.
  function stickyTop(control) {
    const set = () => {
      const header = document.querySelector(".md-header");
      let top = header ? header.getBoundingClientRect().height : 0;
      if (control) top += control.getBoundingClientRect().height;
      document.documentElement.style.setProperty("--rosetta-top", `${Math.round(top)}px`);
    };
    set();
    window.addEventListener("resize", () => {
      set();
      fitHangs();
      align();
    });
    // a tab chosen on a narrow screen shows lines that were hidden when they were measured
    document.addEventListener("change", (event) => {
      if (event.target.closest(".rosetta .tabbed-set")) fitHangs();
    });
  }

  function run() {
    prepareLines();
    setUpView();
  }

  if (document.readyState === "loading") document.addEventListener("DOMContentLoaded", run);
  else run();
})();
