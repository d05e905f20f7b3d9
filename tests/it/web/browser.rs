//! The web view in a real browser (headless Chromium): the page shows a lock appear, queue
//! and leave without a reload, says when it lost the server, and catches up when it is back.
//!
//! `LOCKD_TEST_SCREENSHOT=<file.png>` saves what the page shows with a holder and a queue
//! (the README's picture).

use std::net::SocketAddr;

use serde_json::Value;

use crate::common::browser::Browser;
use crate::common::line::Line;
use crate::common::needs::{have, Need};
use crate::common::{self, Lockd};

/// The page's locks as `name: holder,holder | waiter,waiter` lines.
const LOCKS: &str = r#"[...document.querySelectorAll("[data-lock]")].map(l =>
    l.dataset.lock + ": " + [...l.querySelectorAll("[data-holder]")].map(h => h.dataset.holder).join(",")
    + " | " + [...l.querySelectorAll("[data-waiter]")].map(w => w.dataset.waiter).join(","))"#;
const LINK: &str = r#"document.getElementById("link")?.dataset.state || """#;
const EVENTS: &str =
    r##"[...document.querySelectorAll("#events [data-event]")].map(e => e.textContent)"##;
const PAGE: &str = r#"document.body.innerText"#;

fn lines(value: &Value) -> Vec<String> {
    value
        .as_array()
        .map(|a| {
            a.iter()
                .map(|v| v.as_str().unwrap_or("").to_string())
                .collect()
        })
        .unwrap_or_default()
}

fn shows(browser: &mut Browser, want: &[&str]) {
    browser.until(LOCKS, |v| lines(v) == want, PAGE);
}

#[test]
fn the_page_shows_a_lock_appear_queue_and_leave_without_a_reload() {
    if !have(Need::Chromium) {
        return;
    }
    let listen = SocketAddr::from(([127, 0, 0, 1], common::free_port()));
    let http = SocketAddr::from(([127, 0, 0, 1], common::free_port()));
    let start = || {
        Lockd::new()
            .listen(listen.to_string())
            .args(["--metrics-listen", &http.to_string(), "--web"])
            .spawn()
    };
    let lockd = start();
    let mut browser = Browser::start();
    browser.navigate(&format!("http://{http}/"));
    browser.until(LINK, |v| v == "live", PAGE);
    shows(&mut browser, &[]);
    // Set once: a reload would lose it.
    browser.eval("window.loadedOnce = true");

    let mut a = Line::connect(lockd.addr);
    let t = a.lock("deploy/web deployer-1 ttl=5m note=rolling_out_v42");
    shows(&mut browser, &["deploy/web: deployer-1 | "]);
    let mut b = Line::connect(lockd.addr);
    b.send("LOCK deploy/web deployer-2 ttl=5m session");
    shows(&mut browser, &["deploy/web: deployer-1 | deployer-2"]);
    let mut c = Line::connect(lockd.addr);
    c.send("LOCK deploy/web deployer-3 ttl=5m");
    let mut d = Line::connect(lockd.addr);
    d.lock("backup/db nightly-7 ttl=1h note=pg_dump");
    shows(
        &mut browser,
        &[
            "backup/db: nightly-7 | ",
            "deploy/web: deployer-1 | deployer-2,deployer-3",
        ],
    );
    let page = browser.eval(PAGE);
    let page = page.as_str().unwrap_or_default();
    assert!(page.contains("rolling_out_v42"), "{page}");
    assert!(page.contains(&t.to_string()), "{page}");
    if let Some(path) = std::env::var_os("LOCKD_TEST_SCREENSHOT") {
        std::fs::write(path, browser.screenshot()).expect("write the screenshot");
    }

    // The filter: only names under a prefix.
    browser.eval(
        r#"document.getElementById("prefix").value = "backup/";
        document.getElementById("filter").requestSubmit()"#,
    );
    shows(&mut browser, &["backup/db: nightly-7 | "]);
    browser.eval(
        r#"document.getElementById("prefix").value = "";
        document.getElementById("filter").requestSubmit()"#,
    );

    // Released: the next in line holds it, and the event list says so.
    assert_eq!(a.req(&format!("UNLOCK deploy/web {t}")), "OK");
    let t2 = common::token(&b.line());
    shows(
        &mut browser,
        &[
            "backup/db: nightly-7 | ",
            "deploy/web: deployer-2 | deployer-3",
        ],
    );
    browser.until(
        EVENTS,
        |v| {
            lines(v)
                .iter()
                .any(|e| e.contains("released") && e.contains("deployer-1"))
        },
        PAGE,
    );
    drop(c);
    assert_eq!(b.req(&format!("UNLOCK deploy/web {t2}")), "OK");
    shows(&mut browser, &["backup/db: nightly-7 | "]);
    assert_eq!(
        browser.eval("window.loadedOnce === true"),
        Value::Bool(true)
    );

    // The server goes: the page says so, and catches up when it is back.
    drop(d);
    lockd.kill();
    browser.until(LINK, |v| v == "lost", PAGE);
    let lockd = start();
    let mut e = Line::connect(lockd.addr);
    e.lock("deploy/web after-restart ttl=1m");
    browser.until(LINK, |v| v == "live", PAGE);
    shows(&mut browser, &["deploy/web: after-restart | "]);
    assert_eq!(
        browser.eval("window.loadedOnce === true"),
        Value::Bool(true)
    );
}
