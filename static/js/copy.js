// A button with data-copy="<element id>" copies that element's text to the clipboard
// and says so in its own label for two seconds. Falls back to selecting the text
// (execCommand) where the Clipboard API is not available (plain http on a LAN host).
document.addEventListener("click", async (event) => {
  const button = event.target.closest("button[data-copy]");
  if (!button) return;
  const source = document.getElementById(button.dataset.copy);
  if (!source) return;
  const text = (source.value ?? source.innerText).trim();
  let copied = false;
  try {
    await navigator.clipboard.writeText(text);
    copied = true;
  } catch {
    const range = document.createRange();
    range.selectNodeContents(source);
    const selection = window.getSelection();
    selection.removeAllRanges();
    selection.addRange(range);
    copied = document.execCommand("copy");
  }
  const label = button.dataset.label || button.textContent;
  button.dataset.label = label;
  button.textContent = copied ? "Copied" : "Press Ctrl+C to copy";
  setTimeout(() => { button.textContent = label; }, 2000);
});
