// The side-by-side tab sets (<div class="rosetta" data-impls="KEY ...">, made by
// docs_build/hooks.py) and the reader's choice of what they show.
//
// - The view: every implementation (columns on a wide screen, linked tabs on a narrow one), or
//   two of them, in the order picked ("pair"). A control above the first tab set of a page picks
//   it. The choice is in the address (?a=KEY&b=KEY for a pair), so a link opens the same view,
//   and in localStorage, so the next page opens with it too. The compare page (whole files,
//   <div class="rosetta-compare">) always shows a pair; its default is Flax Linen against NNX.
// - Lines never break inside a name. In six columns long lines wrap, but only at spaces, after an
//   opening bracket, a comma or "=", and before a dot; a token without a space in it is never
//   split, and a continuation hangs four characters right of the line's own indentation (--hang;
//   the indentation itself never wraps). A pair's two columns do not wrap at all (the CSS).
//   The text is unchanged, so copying the code still copies it exactly.
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
    line.style.setProperty("--hang", indent + 4 + "ch");
  }

  // Where a long line may break besides its spaces: after an opening bracket, a comma or "=",
  // and before a dot; inside comments and strings (Pygments' classes c* and s*, which may quote
  // code or a path) also after a slash. Any other token is never split.
  const BREAK_AFTER = /[([{,=]$/;
  const BREAK_INSIDE = /[([{,=/](?=\S)|\w(?=\.\w)/g;

  function allowBreaks(line) {
    const tokens = [...line.children].filter((t) => t.className !== "rosetta-indent");
    tokens.forEach((token, i) => {
      if (/^[cs]/.test(token.className)) breakInside(token);
      else if (!/\s/.test(token.textContent)) token.classList.add("rosetta-token");
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
    for (const line of document.querySelectorAll('.rosetta code > span[id^="__span"]')) {
      if (!line.dataset.hang) {
        line.dataset.hang = "1";
        hang(line);
        allowBreaks(line);
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
    return { view: view === "pair" ? "pair" : "all", a: pair[0], b: pair[1] };
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

  // the words of docs_build/hooks.py's NUMBER_WORDS, which the pages' sentences use
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
      ${compare ? "" : `<label><input type="radio" name="view" value="all"> All ${NUMBERS[keys.length] || keys.length}</label>
      <label><input type="radio" name="view" value="pair"> Two:</label>`}
      <select name="a" aria-label="Left">${options}</select>
      <button type="button" class="rosetta-swap" title="Swap left and right"
        aria-label="Swap left and right">&#8644;</button>
      <select name="b" aria-label="Right">${options}</select>
      ${compare ? "" : `<a class="rosetta-whole">the whole files side by side</a>`}`;
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
  }

  function run() {
    prepareLines();
    setUpView();
  }

  if (document.readyState === "loading") document.addEventListener("DOMContentLoaded", run);
  else run();
})();
