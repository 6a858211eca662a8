"""A parsed, read-only view of one stored message, and safe extraction of its links and codes.

Nothing here raises on bad mail: malformed input is parsed as far as it goes and *flagged* in
``Message.defects``. Only ``link()`` and ``code()`` raise, with ``ExtractionError``, and their
messages never contain the secret itself (links are redacted, codes are masked).
"""

from __future__ import annotations

import binascii
import codecs
import email.charset
import itertools
import re
from collections.abc import Callable, Collection, Iterable, Iterator
from dataclasses import dataclass, field
from datetime import datetime
from email.message import EmailMessage
from email.parser import BytesParser
from email.policy import EmailPolicy
from functools import cached_property, lru_cache
from html import unescape
from html.parser import HTMLParser
from typing import TYPE_CHECKING, Any
from urllib.parse import SplitResult, quote, unquote, unquote_plus, urlsplit

from pytest_mailbox.contract import (
    SEARCH_LIMIT,
    SlowSearch,
    _regex_problem,
    regex_finditer,
    slow_search_text,
)
from pytest_mailbox.endpoint import address, normalize_domain
from pytest_mailbox.errors import ExtractionError
from pytest_mailbox.vocabulary import digest

__all__ = ["Index", "Message", "Recorded", "digest", "index", "mask_secrets", "redact_url"]

#: Four to eight digits standing alone: not part of a longer number, nor of a word of
#: ASCII letters and digits (a token's ``a1b23456c``), nor joined to other digits by a
#: dash or a dot (a phone number's ``1-800-555-0199``, a reference's ``2026-000417``), nor
#: after ``#`` (an order's ``#10482``). Links, dates and times, a postal address's and a
#: card's numbers are taken out of the text before it is searched
#: (``Message.code``): a link's token holds digit runs at random.
DEFAULT_CODE_PATTERN = r"(?<![\dA-Za-z_#])(?<!\d[-.])\d{4,8}(?![\dA-Za-z_])(?![-.]\d)"
_DEFAULT_CODE_SHOWN = (
    "the default pattern (4 to 8 digits outside links, standing alone, or glued to a word "
    "where none stand alone, or in groups such as 483 920 or 483-920 where neither is)"
)
#: Looked for only when the default finds nothing: four to eight digits not touching other
#: digits, as an HTML body's inline tags leave them glued to words (``Code<b>482913</b>``
#: reads ``Code482913``). Outside links, and not a part of a longer number, too.
_GLUED_CODE_PATTERN = r"(?<![\d#])(?<!\d[-.])\d{4,8}(?![\d])(?![-.]\d)"
#: Looked for only when no code stands alone or glued (``_GLUED_CODE_PATTERN``), in the text
#: part nor in the HTML beside a stub one: a code shown in groups to be read, two of
#: three digits joined by a space (a no-break or narrow one too) or a dash (``483 920``,
#: ``483-920``), or three or four of two digits joined by the same space (``48 39 20``).
#: Not a part of a longer grouping (a phone number's ``555 010 4477``, ``01 23 45 67 89``,
#: an amount's ``1 483 920``), nor after ``+``, ``#``, ``(`` or ``(555) ``; two-digit groups not
#: joined by dashes, as a date's are (``03-12-26``); not an amount, after a currency's sign
#: or before it or a unit (``$100 000``, ``100 000 points``). Six to eight single digits joined by
#: one space too: an HTML body that puts each digit in a cell of its own
#: (``<td>4</td><td>8</td>…``) reads ``4 8 3 9 2 0``. ``code()`` returns its digits.
#: What follows an amount in groups, not a code (``100 000 points``, ``2 500 €``).
_AMOUNT_UNITS = (
    "points?|pts|Punkte|miles|km|kg|users|members|customers|people|followers|subscribers"
    "|reviews|downloads|steps|items|orders|stars|credits|coins|euros?|dollars|EUR|USD|GBP|CHF"
)
_SPACED_CODE = (
    r"(?<![\dA-Za-z_+#($\u00a3\u20ac\u00a5])(?<![\d)][-.,/:\u2013 \t\u00a0\u202f])"
    r"(?<![$\u00a3\u20ac\u00a5] )(?:\d{3}(?P<joiner>[ \u00a0\u202f]|[-\u2013])\d{3}"
    r"|\d{2}(?P<space>[ \u00a0\u202f])\d{2}(?:(?P=space)\d{2}){1,2}"
    r"|\d(?P<one>[ \u00a0\u202f])\d(?:(?P=one)\d){4,6})"
    r"(?![\dA-Za-z_/\-\u2013]|[.,:]\d|[ \t\u00a0\u202f]+\d)"
    rf"(?![ \u00a0\u202f]?(?:[$\u00a3\u20ac\u00a5]|(?:{_AMOUNT_UNITS})\b))"
)
_NOT_DIGIT = re.compile(r"\D")
#: Single digits that count up by one (``1 2 3 4 5 6 7``, ``0 1 2 3 4 5 6``) are a scale's
#: points, a cell each, as a survey asks a rating: no code written a digit a cell.
_SCALE = "0123456789"
#: What joins a code's groups in the bodies as a test may show them (``msg.html``,
#: ``msg.text``): the space, no-break space or dash ``code()`` read, as written, as an
#: HTML entity in any of the spellings an HTML parser reads (``483&nbsp;920``,
#: ``483&nbsp920``, ``483&#XA0;920``, ``483&#32;920``), white space of any length (an
#: indented template's), or tags (``<b>483</b> <b>920</b>``, one with a long inline
#: style). Items begin with ``-``, ``&`` or ``<`` and white space runs between them, so
#: a body is read one way only: no backtracking grows with it.
_WRITTEN_FORMS = 64
_WRITTEN_JOINER = (
    r"(?=[\s\-\u2013&<])\s*(?:(?:[-\u2013]"
    r"|&(?:#[0-9]{1,7}|#[xX][0-9a-fA-F]{1,6}|[A-Za-z]{2,32});?"
    r"|<[^<>]{0,2000}>)\s*){0,16}"
)

#: A header value longer than this is not decoded: the standard library's parser takes
#: time that grows with the square of a value made of encoded words (0.4 MiB of them held
#: the sink's event loop for 12 s). Index and ``Message`` both show it as sent.
MAX_PARSED_HEADER = 16 * 1024
#: Header values longer than this are parsed each time rather than kept in the cache.
_MAX_CACHED = 4 * 1024

_REDACTED = "…"
_MASK = "••••"
_MAX_LISTED = 10
_MIN_MASKED_TAIL = 4  # shorter values are shown as bullets only
_REPR_SUBJECT = 60

# Lower-case route words only ("verify", "reset-password"): a token made of letters alone,
# mixed case or long, must never pass for a word.
_WORD = re.compile(r"[a-z]{1,16}(?:[-_][a-z]{1,16}){0,3}")
#: What ``mask_secrets`` hides whatever it is: a run of four or more digits, as a code
#: is ("code 415926", "認証コードは482913です", "code123456"), in a word (``[^\W_]+``);
#: not the digits of an id, whose word mixes several digit runs with letters
#: ("r-44b17272f90f98a3"), nor those of a date or time (``when``): ISO 8601
#: (``2026-12-03T16:30:00.5Z``), ``03/12/2026``, ``2026/12/03``, a time with its seconds'
#: fraction, and the year, time and offset of an RFC 5322 date (``3 Dec 2026 16:30 +0000``).
#: An ISO time keeps its zone (``16:30:05Z``, ``+00:00``); a day first takes ``/``, ``-``
#: or ``.`` (``03-12-2026``, ``03.12.2026``).
_WHEN = (
    r"(?<![^\W_])(?:"
    r"\d{4}-\d{2}-\d{2}(?:[T ]\d{2}:\d{2}(?::\d{2}(?:[.,]\d+)?)?(?:Z|[+-]\d{2}:?\d{2})?)?"
    r"|\d{1,2}[/.-]\d{1,2}[/.-]\d{4}|\d{4}/\d{1,2}/\d{1,2}"
    r"|(?:\d{4} )?\d{1,2}:\d{2}(?::\d{2}(?:[.,]\d+)?)?(?: [+-]\d{4})?"
    r")(?![^\W_])"
)
_MASKABLE = re.compile(f"(?P<when>{_WHEN})|[^\\W_]+")
#: RFC 5322's months, as a date in a header states them (``Thu, 3 Dec 2026 16:30:05``).
_MONTHS = "Jan|Feb|Mar|Apr|May|Jun|Jul|Aug|Sep|Oct|Nov|Dec"
#: A date or a time, or a copyright's year (``© 2026``, ``Copyright (c) 2024-2026``, as a
#: footer states it), whose digits ``code()`` does not take for a code (``2026-12-03``).
#: A year before a time only after a month's name (``Dec 2026 16:30``: ``Code 4829 12:00``
#: is a code); a copyright's year on its sign's line, a few characters on (a bounded gap:
#: each ``©`` of a long run would scan to the run's end).
_DATE_OR_TIME = re.compile(
    _WHEN.replace(r"(?:\d{4} )?", rf"(?:(?<=\b(?:{_MONTHS}) )\d{{4}} )?")
    + r"|(?:\u00a9|\([cC]\)|\b[Cc]opyright\b)[ \t\u00a0\u00a9]{0,8}"
    + r"\d{4}(?:\s*[-\u2013]\s*\d{4})?(?!\d)"
)
#: A date written in words, as a notice states when it was asked for (``December 3, 2026``,
#: ``3 Dec 2026``, ``Dec. 3rd, 2026``, ``December 2026``, ``3. Dezember 2026``,
#: ``2026年12月3日``), or a year since which
#: (``Member since 2019``, ``Est. 1998``): its year is no code.
_MONTH_NAMES = (
    "January|February|March|April|May|June|July|August|September|October|November|December"
    f"|Sept|{_MONTHS}"
)
#: The months of the languages whose senders write a day before them (``3. Dezember
#: 2026``, ``3 décembre 2026``, ``3 de diciembre de 2026``), in any case.
_MONTHS_ABROAD = (
    "Januar|Februar|M\u00e4rz|Mai|Juni|Juli|Oktober|Dezember|janvier|f\u00e9vrier|mars|avril"
    "|juin|juillet|ao\u00fbt|septembre|octobre|novembre|d\u00e9cembre|enero|febrero|marzo"
    "|abril|mayo|junio|julio|agosto|septiembre|octubre|noviembre|diciembre|gennaio|febbraio"
    "|aprile|maggio|giugno|luglio|settembre|ottobre|dicembre|januari|februari|maart|mei"
    "|augustus|janeiro|fevereiro|mar\u00e7o|maio|junho|julho|setembro|outubro|dezembro"
)
_DATE_IN_WORDS = (
    rf"\b(?:(?:{_MONTH_NAMES})\.?(?:[ \u00a0]+\d{{1,2}}(?:st|nd|rd|th)?)?"
    rf"|\d{{1,2}}(?:st|nd|rd|th)?\.?[ \u00a0]+(?:{_MONTH_NAMES})\.?),?[ \u00a0]+\d{{4}}(?!\d)"
    rf"|\b\d{{1,2}}(?:er|\.)?[ \u00a0]+(?:de[ \u00a0]+)?(?i:{_MONTHS_ABROAD}|{_MONTH_NAMES})"
    r"(?:[ \u00a0]+de)?,?[ \u00a0]+\d{4}(?!\d)"
    # Chinese, Japanese and Korean: 2026年12月3日, 2026년 12월 3일.
    r"|\d{4}[ \u00a0]?[\u5e74\ub144]"
    r"|\b(?:[Ss]ince|SINCE|[Ee]st\.|EST\.|[Ee]stablished|[Ff]ounded(?: in)?)[ \u00a0]+"
    r"(?:19|20)\d\d(?!\d)"
)
#: The numbers of a postal address, as a sender's footer states it: a street's number
#: before its name (``1600 Amphitheatre Parkway``, ``10800 NE 8th Street``), or before a
#: French or Spanish street word (``12 rue de Rivoli``; ``Via``, ``Calle`` and ``Rua`` as names
#: write them, capitalised: ``4829 via SMS`` is a code), a suite's (``Suite 700``), a US
#: ZIP code after its state (``Mountain View, CA 94043``), a postal code after a comma
#: before a city that ends the line (``, 75001 Paris``). At most five digits: a code of
#: six or more is never taken for one.
_US_STATES = (
    "AL|AK|AZ|AR|CA|CO|CT|DE|DC|FL|GA|HI|ID|IL|IN|IA|KS|KY|LA|ME|MD|MA|MI|MN|MS|MO|MT|NE|NV"
    "|NH|NJ|NM|NY|NC|ND|OH|OK|OR|PA|PR|RI|SC|SD|TN|TX|UT|VT|VA|WA|WV|WI|WY"
)
_STREET_TYPES = (
    "Street|St|Avenue|Ave|Road|Rd|Boulevard|Blvd|Drive|Dr|Lane|Ln|Way|Parkway|Pkwy|Court"
    "|Ct|Place|Pl|Square|Sq|Terrace|Highway|Hwy|Plaza|Circle|Broadway"
)
_ADDRESS_NUMBER = (
    r"(?<![\w.,-])\d{1,5}[A-Za-z]?(?:[ \u00a0](?:\d{1,3}(?:st|nd|rd|th)"
    rf"|[A-Z][A-Za-z'-]*\.?)){{1,5}}[ \u00a0]+(?:{_STREET_TYPES})\b(?!-)"
    r"|(?<![\w.,-])\d{1,5}(?:[ \u00a0]?(?:bis|ter))?,?[ \u00a0]+"
    r"(?:[Rr]ue|[Aa]venue|[Bb]oulevard|[Pp]lace|[Cc]hemin|[Qq]uai|Calle|Via|Rua)\b"
    r"|\b(?:Suite|Ste|Unit|Floor|Fl|Apt|P\.?[ \u00a0]?O\.?[ \u00a0]?Box)\.?"
    r"[ \u00a0]*#?\d{1,5}(?!\d)"
    rf"|\b[A-Z][a-z]+,?[ \u00a0]+(?:{_US_STATES})[ \u00a0]+\d{{5}}(?:-\d{{4}})?(?!\d)"
    # Its $ is a line's end: it is read as a part of _NOT_CODES, which is MULTILINE.
    r"|,[ \u00a0]*\d{4,5}[ \u00a0]+[A-Z][^\W\d_]+(?=[ \u00a0]*(?:$|[\n,\u00b7|\u2022]))"
)
#: The last four digits of a payment card, as a receipt shows them (``Visa – 4242``,
#: ``ending in 4242``, ``•••• 4242``): no code. Not a PIN in Markdown's bold (``**4829**``,
#: ``** 4829 **``), whose stars close after it, nor after a word's ``xx`` (``Foxx 4829``).
_CARD_DIGITS = (
    r"(?:\b(?:Visa|VISA|Mastercard|MasterCard|Amex|AMEX|American Express|Discover|JCB|Maestro"
    r"|UnionPay|[Ee]nding in|[Ee]nding)\b|(?<![\w•*\u00b7])[•*xX\u00b7]{2,16})"
    r"[ \u00a0\u2013\u2014:•*\u00b7-]{0,6}\d{4}(?!\d|[ \u00a0]{0,2}\*)"
)
#: A phone number as a footer gives one, whose groups may be joined by spaces: after
#: ``+`` (``+44 20 7946 0958``, ``+49 (0)30 12345678``), from a national ``0`` (``0345 300
#: 0000``, ``030 12345678``; not two groups of three or fewer, as a code in groups is),
#: with its area code in brackets (``(030) 1234567``), North American (``1 800 555
#: 0199``), or after a word for one (``Tel.: 1234567``, ``Hotline 0800 1234567``).
_PHONE_NUMBER = (
    r"\+\d{1,3}(?:[ \u00a0]?\(0\)[ \u00a0]?\d{1,5})?(?:[ \u00a0.\-/]\d{1,8}){0,5}(?!\d)"
    r"|(?<![\w.,+-])(?<!\d[ \u00a0])0\d{1,4}[ \u00a0/]\d{6,8}(?!\d|[ \u00a0]\d)"
    r"|(?<![\w.,+-])(?<!\d[ \u00a0])0\d{2,4}(?:[ \u00a0]\d{3,4}){2}(?!\d|[ \u00a0]\d)"
    r"|\(\d{2,5}\)[ \u00a0]?\d{2,8}(?:[ \u00a0.\-]\d{2,8}){0,3}(?!\d)"
    r"|(?<![\w.,+-])(?<!\d[ \u00a0])(?:1[ \u00a0])?\d{3}[ \u00a0]\d{3}[ \u00a0]\d{4}"
    r"(?!\d|[ \u00a0]\d)"
    r"|\b(?:Tel|TEL|Phone|Telefon|Telephone|Fax|Hotline|Mobile)\b\.?:?[ \u00a0]*"
    r"\d{1,8}(?:[ \u00a0/\-]\d{1,8}){0,4}(?!\d)"
)
#: A number after ``No.``, a register's name or an account, as a footer states a
#: company's, an order's, a tax or a bank account's number (``Registered in England No.
#: 2366661``, ``Order no. 10482``, ``HRB 123456``, ``account 12345678``); an IBAN
#: (``DE89 3704 0044 0532 0130 00``); a reference of capitals, a dash and digits
#: (``INV-0042``, ``ORD-10482``). Not an account a sentence names, whose code follows
#: (``Use this code to verify your account: 482913``, ``Ihr Konto 482913``).
_OWNED = r"".join(
    rf"(?<!{word} )"
    for word in ("[Yy]our", "[Tt]he", "[Tt]his", "[Mm]y", "[Oo]ur", "[Nn]ew", "[Ii]hr", "[Dd]ein")
)
_REGISTERED_NUMBER = (
    r"(?<![\w])(?:No\.?|no\.|Nr\.?|nr\.|N[\u00ba\u00b0]\.?|HR[AB]|VAT|ABN|EIN|SIRE[NT]"
    rf"|{_OWNED}(?:[Aa]ccount|[Aa]cct\.?|Konto)|IBAN)"
    r"(?![A-Za-z])[ \u00a0]{0,3}(?::[ \u00a0]{0,3})?(?:#[ \u00a0]{0,3})?"
    r"\d{1,12}(?:[ \u00a0]\d{2,4}){0,4}(?!\d)"
    r"|\b[A-Z]{2}\d{2}(?:[ \u00a0]?[A-Z0-9]{4}){2,7}(?:[ \u00a0]?[A-Z0-9]{1,3})?(?![A-Za-z0-9])"
    r"|(?<![\w-])[A-Z]{3,5}-\d{3,12}(?![\w-])"
)
#: What ``code()`` takes out of a text besides links, dates and times, in one pass.
_NOT_CODES = re.compile(
    f"{_DATE_IN_WORDS}|{_CARD_DIGITS}|{_ADDRESS_NUMBER}|{_PHONE_NUMBER}|{_REGISTERED_NUMBER}",
    re.MULTILINE,
)
_DIGIT_RUN = re.compile(r"\d+")
_DIGITS = re.compile(r"\d{4,}")
#: A word a token could be (``secrets.token_urlsafe``, ``token_hex``, a UUID), judged by
#: ``_is_token``; not the local part of an address (``Billing-Notices2024@…``).
_LONG_WORD = re.compile(r"(?<![\w-])[\w-]{16,}(?![\w@-])", re.ASCII)
#: A run of base64 with a ``+`` or ``/`` in it (standard base64 splits a token at them,
#: leaving pieces too short to look random), its padding included.
_BASE64_RUN = re.compile(
    r"(?<![A-Za-z0-9+/])(?=[A-Za-z0-9/]*\+|[A-Za-z0-9+]*/)[A-Za-z0-9+/]{16,}={0,2}(?![\w+/=@-])"
)
#: A code of capitals and digits, 5 to 15 of them, a letter and a digit at least
#: (``A7K9Q2``, ``K7QXZT``, ``123ABC``): not a word of ASCII letters or digits, nor an
#: address, on either side, though another script's letters may touch it
#: (``コードはA7K9Q2です``). Not letters then digits, as names are (``COVID19``,
#: ``ISO8601``, ``LH400``), whose digit runs of four or more are masked anyway. Capitals
#: alone (``QXKZTR``) cannot be told from a word (``URGENT``): masked once extracted.
_MIXED_CODE = re.compile(
    r"(?<![A-Za-z0-9])(?=[A-Z]*\d)(?=\d*[A-Z])(?![A-Z]+\d+(?![A-Za-z0-9]))"
    r"[A-Z\d]{5,15}(?![A-Za-z0-9@])"
)
#: Such a code in groups joined by dashes (``4F2-7TB``, ``AB12-CD34-EF56-GH78``), 5 to 24
#: capitals and digits in all; not letters and dashed numbers, as names are
#: (``COVID-19``, ``ISO-8601``, ``CVE-2024-12345``, ``EU-WEST-1``).
_DASHED_CODE = (
    r"(?<![A-Za-z0-9-])(?=[A-Z-]*\d)(?=[\d-]*[A-Z])(?![A-Z]+(?:-[A-Z]+)*(?:-\d+)+(?![A-Za-z0-9-]))"
    r"(?=(?:-?[A-Z\d]){5,24}(?![A-Za-z0-9-]))[A-Z\d]{2,8}(?:-[A-Z\d]{1,8})+(?![A-Za-z0-9@-])"
)
#: The codes masked whatever their context, a date or a time aside (``when``): its
#: ``2026-12-03T16`` is neither a dashed nor a mixed code.
_CODES = re.compile(  # each starts with a digit or a capital: the lookahead fails fast
    f"(?=[0-9A-Z])(?:(?P<when>{_WHEN})|{_DASHED_CODE}|{_MIXED_CODE.pattern})"
)  # fmt: skip
#: A code of capitals and digits (``K7Q-9PX``, ``A7K9Q2``) as masking finds one
#: (``_DASHED_CODE``, ``_MIXED_CODE``), for the pattern ``code()``'s error suggests.
_LETTER_CODE = re.compile(f"{_DASHED_CODE}|{_MIXED_CODE.pattern}")
_LETTER_RUN = re.compile(r"[A-Z0-9]+")
#: Four to eight digits after ``#``, which the default reads as an order's number: named,
#: masked, by the error of a search that found no code (``Your code is #482913``).
_HASH_NUMBER = re.compile(r"(?<![\w#])#(\d{4,8})(?![\w])")
#: Digits in groups of one length joined by a space (any, a no-break or a zero-width one
#: too: ``483\u202f920`` is how French number formatting groups them; a tab; up to three
#: of them, as a table or a template aligns them: ``483  920``) or a dash, six to
#: twelve in all, or two groups of three joined by a dot, as a code is shown to be read
#: (``483 920``, ``48-39-20``, ``483.920``, ``5 1 8 2 7 9``, ``483 920 175``),
#: also glued to another script (``コード483 920``) or followed by other numbers (``483 920
#: 2026-12-03``); not a date or a time (``when``), nor years (``2024-2025``), nor numbers
#: whose first groups differ in length (``12 345 678``, ``Dec 10 2026``).
_JOINER = r"(?:[ \t\u00a0\u1680\u2000-\u200d\u202f\u205f\u2060\u3000]{1,3}|[\-\u2013])"
_GROUPED = re.compile(  # (?=\d): every alternative starts with a digit, so it fails fast
    f"(?=\\d)(?:(?P<when>{_WHEN})"
    rf"|(?<![A-Za-z\d.,/-])(?<!\d:)\d+(?:{_JOINER}\d+)+(?![A-Za-z0-9/-]|[.,:]\d)"
    # A dot joins two groups of three only: more dotted numbers are an address, a date,
    # a version or a phone number (192.168.1.1, 12.03.26, 10.20.30, 555.123.4567).
    r"|(?<![A-Za-z\d.,/-])\d{3}\.\d{3}(?![A-Za-z0-9/.-]|[,:]\d))"
)
_GROUP = re.compile(r"\d+")
_YEAR = re.compile(r"(?:19|20)\d\d")
_GROUPED_DIGITS = range(6, 13)
#: Six digits anywhere: fewer cannot make a code in groups (``_GROUPED_DIGITS``).
_SIX_DIGITS = re.compile(r"\d(?:\D*\d){5}")
#: A value its own mailbox extracted is masked inside a longer word from this length on.
_MIN_INSIDE = 4
_HEX = re.compile(r"[0-9A-Fa-f]+")
_UNESCAPE = re.compile(r"\\+(.)")
#: Capitalised words run together, with digits and dashes: a name, not a token.
_CAMEL = re.compile(r"[a-z]*(?:[A-Z][a-z]{2,}|\d|[-_])+")
_UUID = re.compile(r"[0-9A-Fa-f]{8}(?:-[0-9A-Fa-f]{4}){3}-[0-9A-Fa-f]{12}")
#: The plugin's own ids keep their digits and letters: ``r-44b17272f90f98a3``, ``mbx-…``.
_OWN_ID = re.compile(r"(?:r|m|mbx|tc|mcp)-[0-9a-f-]+")
#: What it hides when its digest is a recorded secret: a code or token, any length.
_SECRET_WORD = re.compile(r"[\w\-.~%]+")
_FOLD = re.compile(r"(?:\r\n|\n|\r)[ \t]+")
_LINEBREAKS = re.compile(r"[\r\n]+")
_ESCAPED_BYTES = re.compile("[\udc80-\udcff]+")
_SURROGATE = re.compile("[\ud800-\udfff]")
#: Where a link in plain text ends: white space, quotes, angle brackets, controls (C1 too:
#: windows-1252's ``—`` read as Latin-1 is U+0097) and U+FFFD (a byte its charset has no
#: character for), and the punctuation of other scripts that prose puts right after a
#: link (guillemets, curly quotes, the general punctuation block, CJK and full-width
#: punctuation). Letters of any script stay in (an IRI's path).
_URL_END = (
    "\\s<>\"'`\\x00-\\x1f\\x7f-\\x9f\\ufffd\\u00ab\\u00bb\\u2010-\\u2027\\u2030-\\u205e"
    "\\u3000-\\u303f\\uff01-\\uff0f\\uff1a-\\uff20\\uff3b-\\uff40\\uff5b-\\uff65"
)
#: A ``](`` ends a link too: markdown's ``[url](url)`` (Laravel's text mail) is two links,
#: not one that runs from the first into the second.
_URL_IN_TEXT = re.compile(
    f"https?://[^{_URL_END}\\]]+(?:\\](?!\\()[^{_URL_END}\\]]*)*", re.IGNORECASE
)
#: What masking and code() blank: a link as far as it may run (``](`` included): safe.
_URL_TO_REDACT = re.compile(f"https?://[^{_URL_END}]+", re.IGNORECASE)
_HTTP_SCHEME = re.compile(r"https?://", re.IGNORECASE)
#: A link in angle brackets that a line break cuts (RFC 3986, appendix C: the white space
#: a wrap puts in ``<https://…?\ntoken=…>`` is not the link's), ``<URL:…>`` too.
_WRAPPED_URL = re.compile(r"<(?:URL:)?(https?://[^<>\s]*(?:[ \t]*\n\s*[^<>\s]+)+)>", re.IGNORECASE)
_WRAP = re.compile(r"\s+")
_URL_CONTROL = re.compile(r"[\t\r\n]")
_ADDRESS = re.compile(r"[^\s<>()\[\]@,;:\"]+@[^\s<>()\[\]@,;:\"]+")
_TRAILING = ".,;:!?"
_OPENER = {")": "(", "]": "[", "}": "{"}
_HTML_SKIP = frozenset({"script", "style", "title", "template"})
_HTML_BLOCK = frozenset(
    {
        "address", "article", "aside", "blockquote", "br", "dd", "div", "dl", "dt", "footer",
        "h1", "h2", "h3", "h4", "h5", "h6", "header", "hr", "li", "main", "nav", "ol", "p",
        "pre", "section", "table", "td", "th", "tr", "ul",
    }
)  # fmt: skip


@dataclass(frozen=True)
class Recorded:
    """The digests of the secrets a mailbox recorded, with the store's ``digest``: what
    ``mask_secrets`` masks whatever its length."""

    digests: frozenset[str]
    digest: Callable[[str], tuple[str, str]]
    #: Their last two characters: a word that ends otherwise is not one (no HMAC to run).
    tails: frozenset[str] | None = None
    #: Their lengths: inside a word, only pieces of these lengths are tried.
    sizes: frozenset[int] = frozenset()

    @classmethod
    def of(cls, rows: Iterable[Any], digest: Callable[[str], tuple[str, str]]) -> Recorded:
        """From the store's ``secrets`` rows (``sha256``, ``last2``, ``size``)."""
        rows = list(rows)
        shas = frozenset(row["sha256"] for row in rows)
        sizes = frozenset(row["size"] for row in rows if row["size"] is not None)
        return cls(shas, digest, frozenset(row["last2"] for row in rows), sizes)

    def __contains__(self, value: object) -> bool:
        if not isinstance(value, str) or (self.tails is not None and value[-2:] not in self.tails):
            return False
        return self.digest(value)[0] in self.digests

    def __bool__(self) -> bool:
        return bool(self.digests)


def redact_url(url: str) -> str:
    """A link safe for logs, errors and agent answers: scheme, host and query keys kept.

    ``https://app.example.test/verify/8f3a9c?token=abc&next=home`` becomes
    ``https://app.example.test/…/…?token=…&next=…``. Every path segment is redacted: a token
    may be any segment, and may look like a word (``/magic/plum-tiger-cloud-river``).
    Lower-case word query keys survive; their values, bare keys, credentials and the
    fragment do not. A host label that looks like a token (``_is_token``, read as written:
    ``Zq8Xk2LmN4pR7tVw.login.example.test``) or holds a code (``_CODE_LABEL``:
    ``483920.app.example.test``) is redacted too; the rest of the host stays.
    """
    try:
        parts = urlsplit(_as_browsers_read(url.strip()))
        host = parts.hostname or ""
    except ValueError:
        return _REDACTED
    try:
        port = parts.port
    except ValueError:  # not a number: dropped rather than shown
        port = None
    # An IPv6 address's zone (``fe80::1%eth0``) is any text: shown visible too.
    host = f"[{_visible(host)}]" if ":" in host else _untokened_host(parts.netloc, host)
    if port is not None:
        host = f"{host}:{port}"
    out = f"{parts.scheme}:" if parts.scheme else ""
    if parts.netloc:
        out += f"//{host}"
    out += "/".join(segment and _REDACTED for segment in parts.path.split("/"))
    if parts.query:
        pairs = []
        for pair in parts.query.split("&"):
            key, sep, _ = pair.partition("=")  # a bare key may itself be the token
            pairs.append(f"{_word_or_redacted(key)}={_REDACTED}" if sep else _REDACTED)
        out += "?" + "&".join(pairs)
    return out  # the fragment is dropped: single-page apps carry tokens there


def _untokened_host(netloc: str, host: str) -> str:
    """``host`` (lower case, as ``urlsplit`` reads it) with each label that looks like a
    token redacted, judged as ``netloc`` writes it: its case tells random text from words."""
    written = netloc.rpartition("@")[2].partition(":")[0].split(".")
    labels = host.split(".")
    if len(written) != len(labels):  # pragma: no cover - urlsplit reads netloc so
        return host
    return ".".join(
        # Past DNS's 63 characters a label is no name, and _CODE_LABEL would take long on it.
        _REDACTED
        if len(label) > 63 or _is_token(as_written) or _CODE_LABEL.fullmatch(label)
        else _visible(label)
        for as_written, label in zip(written, labels, strict=True)
    )


def _visible(text: str) -> str:
    """A host label or an address with each character that shows nothing escaped
    (``\\u202e``, ``\\u200b``): a direction override in a link's host reordered the error's
    line in a terminal, and a zero-width space hid that the host is not the one asked for."""
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() else c.encode("unicode_escape").decode() for c in text)


#: A host label that holds a code (``483920.app.example.test``, ``tenant-48291.app.test``,
#: ``k7q9x2.app.example.test``): five digits or more between dashes, or 5–15 letters and
#: digits mixed as random text mixes them (three digits or more, two letters, no four
#: letters in a row, not letters then digits). An address's label (``127``), a name's
#: number (``web001``, ``lb1234``, ``pr-1234``, ``promo-2026``, ``springpromo2026launch``)
#: stays.
_CODE_LABEL = re.compile(
    r"(?:[a-z0-9]*-)*\d{5,}(?:-[a-z0-9]*)*"
    r"|(?![a-z]+\d+$)(?=(?:[a-z]*\d){3})(?=(?:\d*[a-z]){2})(?!.*[a-z]{4})[a-z0-9]{5,15}"
)


def _as_browsers_read(url: str) -> str:
    """In an http(s) URL a browser reads a backslash as a slash: ``https://evil.example\\@app``
    goes to evil.example, where ``urlsplit`` alone would see the host app."""
    return url.replace("\\", "/")


def _word_or_redacted(value: str) -> str:
    """Keep empty and word-like query keys, replace anything else (tokens, ids) by '…'."""
    return value if not value or _WORD.fullmatch(value) else _REDACTED


def mask_secrets(text: str, recorded: Recorded | None = None) -> str:
    """Mask runs of 4+ digits, and any word that is a ``recorded`` secret: ``••••56``.

    Dates and times keep their digits (``2026-12-03``, ``16:30:00.123456``).
    """
    # Each pass looks at every word; most texts (a subject, a selector) give it nothing to
    # do. A code in groups has six digits at least, a masked run four in a row: without
    # them, a pass would hand every word back as it is.
    if _SIX_DIGITS.search(text):
        text = _GROUPED.sub(_mask_grouped, text)
    if _DIGITS.search(text):
        text = _MASKABLE.sub(_mask_digit_runs, text)
    return mask_recorded(text, recorded)


def _mask_grouped(match: re.Match[str]) -> str:
    found = match.group()
    if match.group("when"):
        return found
    groups = list(_GROUP.finditer(found))
    size = len(groups[0].group())
    # The groups of the first one's length that lead (a date or a number may follow:
    # ``483 920 2026-12-03``, ``483 920 10 min``)
    code = list(itertools.takewhile(lambda g: len(g.group()) == size, groups))
    digits = size * len(code)
    if (
        len(code) < 2
        or digits not in _GROUPED_DIGITS
        or all(_YEAR.fullmatch(group.group()) for group in code)
    ):
        return found
    end = code[-1].end()
    hidden = iter(range(digits - 2))  # the last two digits show, as ``_keep_length``'s do
    shown = "".join(
        "\u2022" if c.isdigit() and next(hidden, None) is not None else c for c in found[:end]
    )
    return shown + found[end:]


def mask_subject(text: str, recorded: Recorded | None = None, values: Iterable[str] = ()) -> str:
    """A subject as receipts, errors and a message's repr show it, whoever extracted what:
    links redacted (as ``redact_url`` does), words that look like tokens or like codes of
    letters and digits (``A7K9Q2``) masked, then ``mask_secrets`` (runs of four or more
    digits, ``recorded`` words). ``values`` (what its mailbox extracted, four characters or
    more) are masked also inside a longer word (``認証コードはQXKZTRです``, ``code_QXKZTR``);
    one of digits only, where no digit touches it."""
    text = _URL_TO_REDACT.sub(_redacted_link, text)  # first: a link it extracted reads as one
    present = {v for v in values if len(v) >= _MIN_INSIDE and v in text}
    for value in sorted(present, key=len, reverse=True):
        text = _mask_value(text, value)
    text = _unbased(text)
    text = _LONG_WORD.sub(_masked_if_token, text)
    text = _CODES.sub(_masked_code, text)
    return mask_secrets(text, recorded)


def mask_address(address: str) -> str:
    """An address as errors and a message's repr show it: a local part, or a tag after its
    ``+``, that looks like a token or a code (a reply-by-mail address,
    ``reply+Kx7pQ2mZr9TbW4nYv8Ls@app.example.test``) masked, then ``mask_secrets``."""
    local, at, domain = address.rpartition("@")
    if at:
        alias, plus, tag = local.partition("+")
        local = (_keep_length(alias) if _is_token(alias) else alias) + plus + _masked_tag(tag)
    return mask_secrets(f"{local}{at}{domain}")


def mask_tag(tag: str) -> str:
    """A plus-tag (``alias+tag@domain``) as ``mask_address`` shows it in an address."""
    return mask_secrets(_masked_tag(tag))


def _masked_tag(tag: str) -> str:
    return "+".join(
        _keep_length(piece)
        if _is_token(piece) or _secret_like(piece) or _MIXED_CODE.fullmatch(piece)
        else piece
        for piece in tag.split("+")
    )


def mask_copied(text: str) -> str:
    """Mask what a test may have copied from a message, or from its app, into a selector:
    links (redacted as ``redact_url`` does), words that look like tokens, digit runs, and
    what this process extracted lately (a code it waits for, a token out of a link)."""
    text = _URL_TO_REDACT.sub(_redacted_link, text)
    text = _unbased(text)
    text = _LONG_WORD.sub(_masked_if_token, text)
    text = _CODES.sub(_masked_code, text)
    return mask_extracted(mask_secrets(text))


def _is_token(word: str, least: int | None = None) -> bool:
    """A random-looking word of 16+ characters: letters of both cases, or of one case
    with digits, that change class (upper, lower, digit) at every fourth character or
    more, as random text does, and not capitalised words run together
    (``SpringPromo2026Launch``); hex digits with letters; or a UUID. ``least``: another
    length to start from (a base64 run's letters and digits, without its ``+`` and ``/``)."""
    if len(word) < (_TOKEN_MIN if least is None else least):
        return False
    if _OWN_ID.fullmatch(word) or _CAMEL.fullmatch(word):
        return False
    if _UUID.fullmatch(word) or (
        _HEX.fullmatch(word) and not word.isdigit() and not word.isalpha()
    ):
        return True
    kinds = [_kind(c) for c in word]
    changes = sum(1 for a, b in itertools.pairwise(kinds) if a != b)
    # Both cases, or one case with digits (base 36: ``k7q9x2m4p8z3w6r1``).
    cases = {"u", "l"} & set(kinds)
    # One case with digits only as an unbroken word: a dash or an underscore is a change
    # too, and would make a name of words (``python3-11-slim``, ``signup-22092e91ab``) one.
    one_case = len(cases) == 1 and "d" in kinds and "" not in kinds
    return (len(cases) == 2 or one_case) and changes * 4 >= len(word)


def _kind(char: str) -> str:
    return "u" if char.isupper() else "l" if char.islower() else "d" if char.isdigit() else ""


def _masked_if_token(match: re.Match[str]) -> str:
    word = match.group()
    return _keep_length(word) if _is_token(word) else word


def _masked_if_base64(match: re.Match[str]) -> str:
    """A base64 run masked whole if its letters and digits, read as one word, look like a
    token of both cases, as random base64 has; a path (``/static/js/app``,
    ``bucket1/key2/file3``) does not."""
    run = match.group()
    word = re.sub("[+/=]", "", run)  # 16 long with its + and /, as the run is: long enough
    mixed = not word.islower() and not word.isupper()
    return _keep_length(run) if mixed and _is_token(word, least=len(word)) else run


def _unbased(text: str) -> str:
    """``text`` with its base64 tokens masked (a ``+`` or a ``/`` in it at least)."""
    return _BASE64_RUN.sub(_masked_if_base64, text) if "+" in text or "/" in text else text


def _masked_code(match: re.Match[str]) -> str:
    return match.group() if match.group("when") else _keep_length(match.group())


def _redacted_link(match: re.Match[str]) -> str:
    found = match.group()
    if "\\" in found:  # a pattern's escaped link (``verify\?token=``): read as the link
        return redact_url(_trim_url(_UNESCAPE.sub(r"\1", found)))
    url = _trim_url(found)
    return redact_url(url) + found[len(url) :]


def _mask_digit_runs(match: re.Match[str]) -> str:
    word = match.group()
    if match.group("when"):
        return word
    if len(_DIGIT_RUN.findall(word)) > 1:
        return word  # an id: several digit runs among letters
    return _DIGITS.sub(lambda m: _keep_length(m.group()), word)


def mask_recorded(text: str, recorded: Recorded | None) -> str:
    """Mask only the words that are a ``recorded`` secret, any length: for a whole error
    text, whose ids and fences keep their digits."""

    def hide(match: re.Match[str]) -> str:
        word = match.group()
        core = word.strip(".-~%")  # "QXKZTR." at the end of a sentence is the code QXKZTR
        for candidate in dict.fromkeys((word, core)):
            if candidate and recorded is not None and candidate in recorded:
                return word.replace(candidate, _keep_length(candidate))
        return _hide_inside(word, recorded) if recorded is not None else word

    return _SECRET_WORD.sub(hide, text) if recorded else text


#: A word with more places where a recorded secret could end inside it than this is
#: masked whole rather than searched (each place costs an HMAC per recorded length).
_MAX_TRIED = 256


def _hide_inside(word: str, recorded: Recorded) -> str:
    """``word`` with each recorded secret inside it masked (``認証コードは••••TRです``), as a
    mailbox that kept the value masks it: a process that has only the digests (xdist's
    controller, for a crashed worker's receipt) tries each piece of a recorded length
    that ends as one does. A piece of digits only counts where no digit touches it."""
    if recorded.tails is None:
        return word
    sizes = [n for n in sorted(recorded.sizes, reverse=True) if _MIN_INSIDE <= n < len(word)]
    ends = [i for i in range(_MIN_INSIDE, len(word) + 1) if word[i - 2 : i] in recorded.tails]
    if not sizes or not ends:
        return word
    if len(ends) * len(sizes) > _MAX_TRIED:
        return _keep_length(word)
    hidden = [False] * len(word)
    for end in ends:
        for size in sizes:
            start = end - size
            piece = word[start:end]
            if start < 0 or (piece.isdigit() and _digit_beside(word, start, end)):
                continue
            if piece in recorded:
                hidden[start : end - 2] = [True] * (size - 2)
                break
    if not any(hidden):
        return word
    return "".join("\u2022" if h else c for c, h in zip(word, hidden, strict=True))


def _digit_beside(word: str, start: int, end: int) -> bool:
    return word[start - 1 : start].isdigit() or word[end : end + 1].isdigit()


#: The links and codes this process extracted lately, to mask wherever an error, a
#: traceback or the timeline would quote them: a test may wait with the code it was given
#: (``body_regex=rf"\\b{code}\\b"``), a token taken out of a link, or another mailbox's.
#: Short values (a four-digit PIN) are masked by their own mailbox only.
_EXTRACTED: dict[str, None] = {}
#: Every value the running test extracted, whatever its length and whichever mailbox it
#: came from (the plugin empties it at each test's setup and masks the test's report).
TEST_EXTRACTED: set[str] = set()
_EXTRACTED_KEPT = 256
_MIN_EXTRACTED = 6
_MIN_LINK_PART = 8
_TOKEN_MIN = 16


def remember_extracted(kind: str, value: str) -> set[str]:
    """Keep ``value`` and, for a link, its parts: the running test's report masks the link's
    every part that is not a word, whatever its length (``/reset/48291375``,
    ``?t=kq7pxzmw``); other tests' reports and later errors, the link and its parts that
    look like secrets, of six characters or more. Returns what other tests may mask."""
    own, shared = ({value}, {value}) if kind != "link" else _link_parts(value)
    TEST_EXTRACTED.update(own)
    for part in sorted(shared):
        if len(part) >= _MIN_EXTRACTED:
            _EXTRACTED.pop(part, None)
            _EXTRACTED[part] = None
    while len(_EXTRACTED) > _EXTRACTED_KEPT:
        del _EXTRACTED[next(iter(_EXTRACTED))]
    return shared


def _link_parts(link: str) -> tuple[set[str], set[str]]:
    """(what the test's own report masks, what others may): the query values, path
    segments and fragment values of ``link``, as sent (``k3J%2B9aQ``), decoded and encoded
    again; its path and query as an HTTP client's error shows them (``url:
    /magic/aB3dE5fG7h2k?next=%2Fhome``); and the link encoded as a redirect's parameter.
    Its own test masks every part that is not a lower-case word; others only those that
    look like secrets: ids, numbers and words (``/users/12345678``, ``spring2026``) are
    not, and a bare host is no secret at all (it would mask every other link)."""
    split = urlsplit(link)
    start = link.find(split.netloc) + len(split.netloc) if split.netloc else 0
    tokens, shared = _token_parts(split)
    own = {link, *tokens}
    whole = {link[start:], quote(link, safe="", errors="surrogatepass")}
    if shared:
        shared |= whole
    if shared or own != {link}:
        own |= whole
    if split.path.strip("/") or split.query or split.fragment:
        shared.add(link)
    return own, shared


def _token_parts(split: SplitResult) -> tuple[set[str], set[str]]:
    """(the parts of a link only its own test masks, those others may mask too): its
    query values, path segments and fragment values, each as sent, decoded and encoded
    again (see ``_link_parts``)."""
    raw = [*split.path.split("/")]
    for pairs in (split.query, split.fragment):  # a fragment may hold a query (OAuth)
        for pair in re.split("[&;]", pairs) if pairs else ():
            raw.append(pair.partition("=")[2] if "=" in pair else pair)
    own: set[str] = set()
    shared: set[str] = set()
    for value in raw:
        decoded = unquote_plus(value)
        forms = {value, decoded, quote(decoded, safe="", errors="surrogatepass")}
        if _secret_like(decoded):
            shared |= forms
        elif _token_for_its_test(decoded):
            own |= forms
    return own, shared


def remember_listed(links: Iterable[str]) -> None:
    """The parts of listed links (``msg.links()``) that may be their tokens, for the running
    test's report to mask, as it masks those of an extracted link; not the links whole,
    nor in other tests' reports: ``https://app.example.test/help`` stays readable, and a
    newsletter's thirty links do not push extracted secrets out of ``_EXTRACTED``."""
    for link in links:
        own, shared = _token_parts(urlsplit(link))
        TEST_EXTRACTED.update(own | shared)


def _token_for_its_test(part: str) -> bool:
    """A part of a link its own test masks too, though others may show its like: six
    digits or more (``/reset/48291375``), or eight letters and digits that are no name
    (``?t=kq7pxzmw``); not a word, a date, an address or a path (``en-US``,
    ``alice%40example.test``, ``ConfirmEmail``)."""
    if part.isdigit():
        return len(part) >= _MIN_EXTRACTED
    return (
        len(part) >= _MIN_LINK_PART
        and part.isalnum()
        and part.isascii()
        and any(c.isdigit() for c in part)
        and not (_CAMEL.fullmatch(part) and not part.islower())  # ConfirmEmail2, not abc123
    )


def _secret_like(part: str) -> bool:
    """A part of a link that may be its token: random-looking (``_is_token``), or eight
    characters or more that go from letters to digits and back at least three times
    (``aB3dE5fG7h2k``), which a word with a number (``v2beta1``) does not."""
    if _is_token(part):
        return True
    kinds = ["a" if c.isalpha() else "d" if c.isdigit() else "" for c in part]
    switches = sum(1 for a, b in itertools.pairwise(k for k in kinds if k) if a != b)
    return len(part) >= _MIN_LINK_PART and switches >= 3


def extracted_here(also: Iterable[str] = ()) -> set[str]:
    """Every value this process knows was extracted: the running test's (from any mailbox),
    what it remembers of other tests, and ``also``: what a subject shown for one mailbox is
    masked with, since the code a test took from one mailbox may be in another's mail."""
    return {*TEST_EXTRACTED, *_EXTRACTED, *also}


def mask_extracted(text: str, also: Iterable[str] = ()) -> str:
    """Mask what this process extracted lately, and ``also`` these values, wherever they
    show in ``text``: in one pass, longest first, so a link is masked whole."""
    return mask_values(text, {*_EXTRACTED, *also})


def mask_values(text: str, values: Iterable[str]) -> str:
    """Mask every occurrence of each of ``values`` (secrets this process extracted), also
    inside a longer word or a quoted pattern (``/\\bQXKZTR\\b/``)."""
    for value in sorted({v for v in values if v in text}, key=len, reverse=True):
        text = text.replace(value, _keep_length(value))
    return text


class Masker:
    """Masks what tests extracted in output pytest shows (reports, warnings).

    - ``values`` (the running test's, and open mailboxes' of six characters or more) and
      ``shared`` (what the process remembers of other tests): wherever they show, also
      inside a word;
    - ``words`` (short values of other tests' open mailboxes): only where they stand
      alone, so that another test's PIN ``2026`` leaves ``2026-12-03`` as it is.

    A value of digits only is masked where no digit touches it: a remembered ``827907``
    leaves ``job 8279071`` as it is. A value is also masked where pytest cut a long repr
    short around ``...`` (``'…token=Zq8xYtK2m...e team'``) and across the quoted-printable
    soft line breaks (``=`` at a line's end) of a raw message a test printed; a cut or
    broken piece is bullets only. Built once for a set of values, it remembers what it
    looked up.
    """

    def __init__(
        self, values: Collection[str], words: Collection[str] = (), shared: Collection[str] = ()
    ) -> None:
        # A raw quoted-printable body shows ``=`` and non-ASCII as ``=3D``, ``=E3=82=B3``.
        escaped = {v: _quoted_printable(v) for v in values if v}
        also = {v: _quoted_printable(v) for v in shared if v and v not in escaped}
        # An ASCII value's escaped form differs only in its ``=`` (``=3D``): a cut piece of
        # it is as long as one of the value. Not another's: eight characters of
        # ``=E3=82=B3…`` are one character, which unrelated text shows as well.
        # A header's Q-encoded word escapes more (``_`` as ``=5F``, ``.`` as ``=2E``).
        headed = {v: _q_encoded(v) for v in escaped if v.isascii()}
        cuttable = {
            *escaped,
            *(form for v, form in escaped.items() if v.isascii()),
            *headed.values(),
        }
        # A cut is matched on codes and tokens only: a link's start is its host, which an
        # unrelated line may show just as well (``Connecting to https://app…...``).
        self.cut = [
            v for v in sorted(cuttable, key=len, reverse=True) + sorted(also)
            if _MIN_CUT <= len(v) <= _MAX_PIECED and "://" not in v and "%3A%2F%2F" not in v
            and "=3A//" not in v and v[0] != "/"
        ]  # fmt: skip
        forms = {*escaped, *escaped.values(), *headed.values()}
        self.values = sorted(forms, key=len, reverse=True)
        #: What an RFC 2047 encoded word's decoded text is searched for (``_mask_encoded``).
        self.plain = sorted({*escaped, *also}, key=len, reverse=True)
        self.shared = frozenset({*also, *also.values()}) - forms
        #: A value that ``_gapless`` would cut into, for which a text is joined exactly.
        self.gappy = any(map(_gappy, (*self.values, *self.shared)))
        self._by_piece: dict[str, list[str]] = {}
        shown = sorted({w for w in words if w and w not in self.values}, key=len, reverse=True)
        alternatives = "|".join(map(re.escape, shown))
        alone = rf"(?<![\w\-:./])(?:{alternatives})(?![\w\-:./]|\s\d{{1,2}}:\d\d)"
        self.words = re.compile(alone) if shown else None

    def __call__(self, text: str) -> str:
        if _CUT in text or " chars]" in text:  # first: a shorter value masked inside a
            text = self._mask_cut(text)  # cut one would hide its start
        if self.cut and " identical " in text and _SKIPPED.search(text):
            text = self._mask_diff(text)
        if "=?" in text:
            text = self._mask_encoded(text)
        for value in self._present(text):
            text = _mask_value(text, value)
        for soft in (_SOFT_BREAK, _WRAP_BREAK):
            # Every line break may be a wrap: the values a text holds without them are found
            # in it with more taken out, by plain string operations (``_WRAP_BREAK`` tries
            # each character: ten times the whole mask's time on a long captured log); a
            # value is masked by its own pattern, which finds nothing where that found one
            # wrongly.
            cheap = soft is _WRAP_BREAK and not self.gappy
            if cheap or soft.search(text):
                joined = _gapless(text) if cheap else soft.sub("", text)
                for value in self._present(joined):
                    if _MIN_EXTRACTED <= len(value) <= _MAX_PIECED:
                        text = _soft_broken(value, soft).sub(_bullets, text)
        if self.words is not None:
            text = self.words.sub(lambda match: _keep_length(match.group()), text)
        return text

    def _mask_encoded(self, text: str) -> str:
        """``text`` with what RFC 2047 encoded words carry of a value masked: a raw header
        the email package folded (a long subject with a link in it) splits a value across
        encoded words and escapes it (``token=3DZq8x?=\\n =?utf-8?q?K2m=5FPw``), or base64
        encodes it. Each run of encoded words is decoded, and the characters that encode a
        value's bytes become bullets, the words' frames and line breaks kept."""
        hidden: list[tuple[int, int]] = []
        for run in _encoded_runs(text):
            if next(self._hits(_quickly_decoded(run.words), run), None) is None:
                continue  # most runs: no character by character decoding
            decoded, spans = _decoded([(cs, _encoded_bytes(word)) for cs, word in run.words])
            for start, end in self._hits(decoded, run):
                hidden.extend(span for piece in spans[start:end] for span in piece)
        if not hidden:
            return text
        shown = list(text)
        for start, end in hidden:
            shown[start:end] = "\u2022" * (end - start)
        return "".join(shown)

    def _hits(self, decoded: str, run: _Run) -> Iterator[tuple[int, int]]:
        """Where ``decoded`` (a run's text) holds a value, and, in a run pytest cut
        (``...``) short, a value's piece at the cut, as ``_mask_cut`` finds it."""
        yield from self._found_in(decoded)
        for value in self.cut if run.cut_start or run.cut_end else ():
            size = _start_before_cut(decoded, value) if run.cut_end else 0
            if size:
                yield len(decoded) - size, len(decoded)
            size = _end_after_cut(decoded, value) if run.cut_start else 0
            if size:
                yield 0, size

    def _found_in(self, decoded: str) -> Iterator[tuple[int, int]]:
        """Where ``decoded`` holds a value, as ``__call__`` finds them (a value of digits
        where no digit touches it; a short one of ``words`` where it stands alone)."""
        for value in self.plain:
            at = decoded.find(value)
            while at != -1:
                end = at + len(value)
                touching = value.isdigit() and (
                    decoded[at - 1 : at].isdigit() or decoded[end : end + 1].isdigit()
                )
                if not touching:
                    yield at, end
                at = decoded.find(value, at + 1)
        if self.words is not None:
            for match in self.words.finditer(decoded):
                yield match.span()

    def _present(self, text: str) -> list[str]:
        """The values ``text`` holds, longest first."""
        found = [v for v in self.values if v in text]
        found += [v for v in self.shared if v in text]
        return sorted(set(found), key=len, reverse=True)

    def _having(self, piece: str) -> list[str]:
        found = self._by_piece.get(piece)
        if found is None:
            found = self._by_piece[piece] = [v for v in self.cut if piece in v]
        return found

    def _mask_cut(self, text: str) -> str:
        parts = _CUTS.split(text)  # text, cut, text, cut, …, text
        for i in range(1, len(parts), 2):
            # pytest cuts with three dots; more belong to a piece, before or after them
            # (``'https://app....Q9sL1'`` keeps ``https://app.``).
            cut = parts[i] if parts[i].startswith(_CUT) else ""  # or unittest's [N chars]
            extra = cut[len(_CUT) :]
            best: tuple[int, str, str] | None = None
            for at in dict.fromkeys((0, len(extra))):
                before, after = parts[i - 1] + extra[:at], extra[at:] + parts[i + 1]
                start, end = self._start_of_value(before), self._end_of_value(after)
                if best is None or start + end > best[0]:
                    shown = before[: len(before) - start] + "\u2022" * start
                    best = (start + end, shown, "\u2022" * end + after[end:])
            assert best is not None
            _, parts[i - 1], parts[i + 1] = best
            parts[i] = _CUT if cut else parts[i]
        return "".join(parts)

    def _mask_inner(self, body: str) -> str:
        """``body`` with every piece of a value of eight characters or more masked, where it
        shows at least half of it or eight characters (a line pytest cut on both sides)."""
        hidden = [False] * len(body)
        for value in self.cut:
            if len(value) < _MIN_INNER:
                continue
            size = _overlap(value)
            for at in range(len(value) - size + 1):
                found = body.find(value[at : at + size])
                while found != -1:
                    hidden[found : found + size] = [True] * size
                    found = body.find(value[at : at + size], found + 1)
        if not any(hidden):
            return body
        return "".join("\u2022" if h else c for c, h in zip(body, hidden, strict=True))

    def _start_of_value(self, before: str, least: int | None = None) -> int:
        """How long a start of a value ends ``before``."""
        having = self._having(before[-_MIN_CUT:])
        return max((_start_before_cut(before, v, least) for v in having), default=0)

    def _end_of_value(self, after: str, least: int | None = None) -> int:
        """How long an end of a value begins ``after``."""
        having = self._having(after[:_MIN_CUT])
        return max((_end_after_cut(after, v, least) for v in having), default=0)

    def _mask_diff(self, text: str) -> str:
        """The lines of pytest's diff after "Skipping N identical leading (trailing)
        characters in diff": each begins (ends) where pytest cut both strings, perhaps
        inside a value, whose piece there is masked from three characters on."""
        lines = text.split("\n")
        edges: set[str] = set()  # both, for strings of one length: cut on either side
        for i, line in enumerate(lines):
            skipped = _SKIPPED.search(line)
            if skipped is not None:
                edges.add(skipped.group(1))
                continue
            if not edges or not line.strip():
                continue
            head, body, tail = _DIFF_BODY.match(line).groups()  # type: ignore[union-attr]
            start = self._end_of_value(body, _MIN_CUT) if "leading" in edges else 0
            end = self._start_of_value(body, _MIN_CUT) if "trailing" in edges else 0
            if start + end >= len(body):
                body = "\u2022" * len(body)
            else:
                body = "\u2022" * start + body[start : len(body) - end] + "\u2022" * end
            if len(edges) == 2:  # cut on both sides: a value's middle may show alone
                body = self._mask_inner(body)
            lines[i] = head + body + tail
        return "\n".join(lines)


_CUT = "..."  # what pytest's saferepr puts in the middle of a repr it shortens
#: saferepr's dots, and unittest's ``[36 chars]`` (``assertEqual`` shortens both values).
_CUTS = re.compile(r"(\.{3,}|\[\d+ chars\])")
#: pytest's diff of two long strings, cut where they start (end) to differ.
_SKIPPED = re.compile(r"Skipping \d+ identical (leading|trailing) characters in diff")
#: A line of that diff: the report's ``E`` and indent, ndiff's ``- ``, ``+ ``, ``? `` or
#: ``  ``, then the text (its indent is taken as the line's: a cut never ends in spaces).
_DIFF_BODY = re.compile(r"(E?[ \t]*(?:[-+?] )?[ \t]*)(.*?)([ \t\r]*)$")
#: The shortest piece of a value next to a cut that counts: half of a six-digit code.
_MIN_CUT = 3
#: The shortest value whose middle, alone in a line cut on both sides, counts.
_MIN_INNER = 8
#: Longer values are masked whole only: cut or soft-broken pieces of them cost too much.
_MAX_PIECED = 4096
#: What starts a line of pytest's report: an explanation's ``E`` and indent, and a diff's
#: ``+ `` or ``- `` (``E         + dKxHdc``, ``  + dKxHdc`` in the crash message).
_LINE_START = r"(?:E?[ \t]+(?:[-+][ \t]+)?|[-+][ \t]+)?"
#: Where pytest's repr of the lines of a raw message ends one and starts the next: a
#: string split at its line breaks by ``-vv`` (``…=\\r\\n'`` then ``E  +   'dKx…``), or a
#: list's items (``splitlines()``: ``…Z=', 'dKx…``).
_NEXT_ITEM = rf"['\"],?(?: |\r?\n{_LINE_START})['\"]"
#: A line's end as a raw message is printed, or as pytest shows one in a repr, a diff or
#: a list (``\\r\\n``, then the next item's quote).
_LINE_BREAK = rf"(?:\r?\n{_LINE_START}|(?:\\r\\n|\\n)(?:{_NEXT_ITEM})?|{_NEXT_ITEM})"
#: A quoted-printable soft line break, as printed or as a repr shows it (``=\\r\\n``),
#: with the white space a transport may add after its ``=`` (RFC 2045 6.7), and what
#: starts the next line where pytest shows the text in a diff or a list.
_SOFT_BREAK = re.compile(rf"=(?:[ \t]|\\t)*{_LINE_BREAK}")
#: A line break that a value may be cut at in a raw message with nothing of its own there:
#: a ``format=flowed; delsp=yes`` soft line break (RFC 3676: a space at a line's end, where
#: Apple Mail cuts a long link), or the wrap of a link in angle brackets (RFC 3986,
#: appendix C: ``<https://…?token=Zq8x`` then ``  K2mP…>``), which ``link()`` reads whole.
#: Quoted-printable writes the flowed line's last space as ``=20`` (RFC 2045 6.7), and may
#: cut the same value with a soft line break of its own (``token=3DZq8=`` then ``x=20``):
#: either is a break here.
_WRAP_BREAK = re.compile(rf"{_SOFT_BREAK.pattern}|(?:[ \t]|=20|=09)*{_LINE_BREAK}[ \t]*")
#: What ``_gapless`` takes out of a text: a superset of what ``_WRAP_BREAK`` matches.
_GAPS = ("=20", "=09", "\\r", "\\n", " ", "\t", "\r", "\n", "'", '"', ",")
_NEW_LINE = re.compile(rf"\n{_LINE_START}")


def _gapless(text: str) -> str:
    """``text`` with its quoted-printable soft line breaks, the starts of pytest's report
    lines and all of ``_GAPS`` taken out: a value that ``_WRAP_BREAK`` breaks shows whole
    in it, unless ``_gappy``. Plain string operations, unlike ``_WRAP_BREAK.sub``."""
    text = _NEW_LINE.sub("", _SOFT_BREAK.sub("", text))
    for gap in _GAPS:
        text = text.replace(gap, "")
    return text


def _gappy(value: str) -> bool:
    """Whether ``_gapless`` may take something of ``value`` out: a gap in it, or its
    ``=`` before a ``20`` or ``09`` of the text."""
    return value.endswith("=") or "\\" in value or any(gap in value for gap in _GAPS)


#: What ``_bullets`` keeps of a soft-broken value: its line breaks, lines' starts, quotes.
_KEPT = re.compile(rf"{_NEXT_ITEM}|\r?\n{_LINE_START}|\r")


#: The rest of an encoded word whose start pytest cut away (``...5xS=5FEWg?=``), up to its
#: ``?=``. It holds no ``...`` of its own: each character is scanned from one start only
#: (``[^?\s]+`` scanned a line of dots from each dot: 100 kB with ``=?`` in it took 40 s).
_CUT_REST = r"(?:[^?\s.]|\.(?!\.\.))+"
#: An RFC 2047 encoded word: its charset (a language after ``*`` aside), Q or B, its text.
_ENCODED_WORD = re.compile(
    r"=\?(?P<charset>[^?*\s]+)(?:\*[^?\s]*)?\?(?P<encoding>[QqBb])\?"
    r"(?P<text>[^?\s]*?)(?:\?=|(?P<cut>(?=\.\.\.)))"
    # the rest of a word whose start pytest cut away: read as Q
    rf"|(?<=\.\.\.)(?P<rest>{_CUT_REST})\?="
)
#: What joins two encoded words of one run: folding white space, as printed or in a repr,
#: and what ``-vv`` puts between a raw message's lines (``E         +  =?utf-8?q?…``).
_BETWEEN_WORDS = re.compile(
    rf"(?:\r?\n{_LINE_START}|(?:\\r\\n|\\n)(?:{_NEXT_ITEM})?|{_NEXT_ITEM})?(?:[ \t]|\\t)+"
)
_HEX_PAIR = re.compile(r"[0-9A-Fa-f]{2}")
_BASE64_QUAD = re.compile(r"[A-Za-z0-9+/=]{1,4}")
#: Each byte an encoded word carries, with where its text shows it: (byte, start, end).
_Bytes = list[tuple[int, int, int]]


@dataclass
class _Run:
    """Encoded words joined by folding white space: each one's charset and match, and
    whether pytest cut the run short at its start or its end (``...``)."""

    words: list[tuple[str, re.Match[str]]] = field(default_factory=list)
    cut_start: bool = False
    cut_end: bool = False


def _encoded_runs(text: str) -> Iterator[_Run]:
    """Each run of encoded words in ``text``, a word cut short by pytest's ``...`` (its end,
    or its start) included."""
    run = _Run()
    end = -1
    for match in _ENCODED_WORD.finditer(text):
        rest = match["rest"] is not None
        joined = not rest and _BETWEEN_WORDS.fullmatch(text, end, match.start())
        if run.words and (run.cut_end or not joined):
            yield run
            run = _Run()
        run.cut_start = run.cut_start or (rest and not run.words)
        charset = "utf-8" if rest else match["charset"].lower()
        run.words.append((charset, match))
        run.cut_end = match["cut"] is not None
        end = match.end()
    if run.words:
        yield run


def _quickly_decoded(words: list[tuple[str, re.Match[str]]]) -> str:
    """The text of a run of encoded words, decoded whole (as ``_decoded`` does, without
    the spans): enough to tell whether it holds a value at all."""
    parts: list[str] = []
    for charset, group in itertools.groupby(words, key=lambda word: word[0]):
        data = b"".join(_word_bytes(word) for _, word in group)
        parts.append(data.decode(_text_codec(charset).name, "replace"))
    return "".join(parts)


def _word_bytes(word: re.Match[str]) -> bytes:
    """The bytes ``_encoded_bytes`` reads in a word, for a Q word of ASCII at C speed."""
    payload = word["rest"] if word["rest"] is not None else word["text"]
    if (word["rest"] is not None or word["encoding"] in "Qq") and payload.isascii():
        return _Q_ESCAPE.sub(_q_byte, payload).encode("latin-1")
    return bytes(byte for byte, _, _ in _encoded_bytes(word))


_Q_ESCAPE = re.compile(r"=([0-9A-Fa-f]{2})|_")


def _q_byte(match: re.Match[str]) -> str:
    return chr(int(match[1], 16)) if match[1] else " "


def _encoded_bytes(word: re.Match[str]) -> _Bytes:
    """The bytes one encoded word carries, each with the span of text that encodes it; a
    base64 group that does not decode (padding broken, a stray character) carries none."""
    group = "rest" if word["rest"] is not None else "text"
    start, payload = word.start(group), word[group]
    found: _Bytes = []
    if group == "text" and word["encoding"] in "Bb":
        for quad in _BASE64_QUAD.finditer(payload):
            piece = quad.group().rstrip("=")
            try:
                data = binascii.a2b_base64(piece + "=" * (-len(piece) % 4))
            except binascii.Error:
                continue
            span = (start + quad.start(), start + quad.end())
            found.extend((byte, *span) for byte in data)
        return found
    at = 0
    while at < len(payload):
        char = payload[at]
        if char == "=" and _HEX_PAIR.fullmatch(payload, at + 1, at + 3):
            found.append((int(payload[at + 1 : at + 3], 16), start + at, start + at + 3))
            at += 3
            continue
        data = b" " if char == "_" else char.encode("utf-8", "surrogatepass")
        found.extend((byte, start + at, start + at + 1) for byte in data)
        at += 1
    return found


def _decoded(run: list[tuple[str, _Bytes]]) -> tuple[str, list[list[tuple[int, int]]]]:
    """A run of encoded words as text, with the spans of text that encode each character.
    Adjacent words of one charset are decoded together (a character may be split between
    them); an unknown charset is read as UTF-8."""
    text: list[str] = []
    spans: list[list[tuple[int, int]]] = []
    for charset, words in itertools.groupby(run, key=lambda word: word[0]):
        codec = _text_codec(charset)
        decoder = codec.incrementaldecoder("replace")
        ascii_safe = _ASCII_SAFE.fullmatch(codec.name)
        pending: list[tuple[int, int]] = []
        for byte, start, end in itertools.chain.from_iterable(w[1] for w in words):
            if ascii_safe and byte < 0x80 and not pending:  # the common case, fast
                text.append(chr(byte))
                spans.append([(start, end)])
                continue
            pending.append((start, end))
            out = decoder.decode(bytes([byte]))
            if out:
                text.extend(out)
                spans.extend([pending] * len(out))
                pending = []
    return "".join(text), spans


def _text_codec(charset: str) -> codecs.CodecInfo:
    """The codec of ``charset``, or UTF-8 if it names no text codec (an unknown name,
    ``base64``, ``rot13``)."""
    try:
        info = codecs.lookup(email.charset.ALIASES.get(charset, charset))
    except (LookupError, ValueError):
        return codecs.lookup("utf-8")
    return info if getattr(info, "_is_text_encoding", True) else codecs.lookup("utf-8")


#: A text part of more words than this (its links aside) is no stub (``_is_stub``).
_STUB_WORDS = 20


def _is_stub(text: str) -> bool:
    """``text``, a text part beside an HTML one, only says where to read the mail: a few
    words, with a link to it (``View this email in your browser: https://…``) or naming
    HTML (``This message needs an HTML mail client``)."""
    if not text.strip():
        return False
    words = _URL_TO_REDACT.sub(" ", text).split()
    return len(words) <= _STUB_WORDS and (
        _HTTP_SCHEME.search(text) is not None or "html" in text.lower()
    )


#: Codecs that read an ASCII byte as that character whatever came before it (not
#: ISO-2022-JP's escapes, nor UTF-7's or UTF-16's units).
_ASCII_SAFE = re.compile(
    r"utf-8|ascii|latin-1|iso8859-\d+|cp125\d|cp9(?:32|49|50)|koi8-[a-z]+"
    r"|shift_jis\w*|euc_\w+|gb2312|gbk|gb18030|big5\w*"
)


def _overlap(value: str) -> int:
    """How much of ``value`` a cut piece must show to count: half of it, 3 to 8."""
    return min(8, max(_MIN_CUT, len(value) // 2))


def _start_before_cut(before: str, value: str, least: int | None = None) -> int:
    """How long a start of ``value`` ends ``before`` (0 if shorter than ``least``, by
    default ``_overlap(value)``: too short to tell)."""
    tail = before[-_MIN_CUT:]
    if len(tail) < _MIN_CUT:
        return 0
    best, at = 0, value.find(tail)
    while at != -1:
        size = at + _MIN_CUT
        # The piece starts where a word does: not in the middle of a number (``8279071``);
        # or after an escape of quoted-printable or a Q-encoded word (``token=3DZq8x``).
        edge = before[-size - 1 : -size] if size < len(before) else ""
        escape = (
            _QP_ESCAPE.fullmatch(before[-size - 3 : -size]) if size + 3 <= len(before) else None
        )
        enough = size >= (_overlap(value) if least is None else least)
        if enough and (escape or not edge.isalnum()) and before.endswith(value[:size]):
            best = max(best, size)
        at = value.find(tail, at + 1)
    return best


def _end_after_cut(after: str, value: str, least: int | None = None) -> int:
    """How long an end of ``value`` begins ``after`` (0 if shorter than ``least``)."""
    head = after[:_MIN_CUT]
    if len(head) < _MIN_CUT:
        return 0
    best, at = 0, value.find(head)
    while at != -1:
        size = len(value) - at
        edge = after[size : size + 1]  # the piece ends where a word does
        enough = size >= (_overlap(value) if least is None else least)
        if enough and not edge.isalnum() and after.startswith(value[at:]):
            best = max(best, size)
        at = value.find(head, at + 1)
    return best


#: A quoted-printable escape (RFC 2045), as a body or a Q-encoded word shows it: ``=3D``.
_QP_ESCAPE = re.compile(r"=[0-9A-F]{2}")
#: What a Q-encoded word (RFC 2047) shows as it is, as Python's email package writes one.
_Q_PLAIN = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789!*+-/")


def _q_encoded(value: str) -> str:
    """``value`` as a header's Q-encoded word carries it (RFC 2047 4.2): a space as ``_``,
    every byte but letters, digits and ``!*+-/`` as ``=XX``."""
    return "".join(
        c if c in _Q_PLAIN else "_" if c == " " else
        "".join(f"={b:02X}" for b in c.encode("utf-8", "surrogatepass"))
        for c in value
    )  # fmt: skip


def _quoted_printable(value: str) -> str:
    """``value`` as a quoted-printable body carries it (RFC 2045: ``=`` and every byte
    that is not printable ASCII as ``=XX``); soft line breaks aside (``_soft_broken``)."""
    if value.isascii() and "=" not in value:
        return value
    return "".join(
        c if c.isascii() and c.isprintable() and c != "=" else
        "".join(f"={b:02X}" for b in c.encode("utf-8", "surrogatepass"))
        for c in value
    )  # fmt: skip


@lru_cache(maxsize=1024)
def _soft_broken(value: str, soft: re.Pattern[str] = _SOFT_BREAK) -> re.Pattern[str]:
    """``value`` with a soft line break (quoted-printable's, or ``soft``) allowed between
    any two characters; one of digits only where no digit touches it, as ``_mask_value``
    masks it (every line break is a ``_WRAP_BREAK``: ``job 8279071`` then a line)."""
    separator = f"(?:{soft.pattern})?"
    pattern = separator.join(map(re.escape, value))
    return re.compile(rf"(?<!\d){pattern}(?!\d)" if value.isdigit() else pattern)


def _bullets(match: re.Match[str]) -> str:
    text, shown, at = match.group(), [], 0
    for kept in _KEPT.finditer(text):
        shown += ["\u2022" * (kept.start() - at), kept.group()]
        at = kept.end()
    return "".join(shown) + "\u2022" * (len(text) - at)


def _mask_value(text: str, value: str) -> str:
    """Mask ``value`` wherever ``text`` holds it, also inside a word; one of digits only
    where no digit touches it (a remembered ``827907`` leaves ``job 8279071`` as it is).
    Digits too few to show two of (a code's group on a line of its own: ``7`` of a code
    written one digit a cell, ``<td>\n  7\n</td>``) are bullets only: each line shown
    with its last two characters showed the code whole, a digit a line."""
    if value.isdigit():
        shown = _keep_length(value) if len(value) >= _MIN_MASKED_TAIL else _MASK
        return re.sub(rf"(?<!\d){value}(?!\d)", shown, text)
    return text.replace(value, _keep_length(value))


def _keep_length(word: str) -> str:
    return "\u2022" * max(len(word) - 2, 2) + word[-2:]


def _mask(value: str) -> str:
    """``••••56``: bullets and the last two characters (bullets only for very short values)."""
    return _MASK + (value[-2:] if len(value) >= _MIN_MASKED_TAIL else "")


def _show(pattern: str) -> str:
    """A pattern as the user would write it: ``r"code: (\\d{6})"``."""
    if '"' in pattern or pattern.endswith("\\") or not pattern.isprintable():
        return repr(pattern)
    return f'r"{pattern}"'


def _clean(value: str) -> str:
    """Turn surrogate-escaped raw bytes back into text: UTF-8 if it decodes, else Latin-1."""
    if not _SURROGATE.search(value):
        return value

    def decode_run(match: re.Match[str]) -> str:
        data = match.group().encode("utf-8", "surrogateescape")
        try:
            return data.decode("utf-8")
        except UnicodeDecodeError:
            return data.decode("latin-1")

    return _SURROGATE.sub("\ufffd", _ESCAPED_BYTES.sub(decode_run, value))


def _host(url: str) -> str:
    """The URL's host as a browser reads it: lower-case, without port or trailing dot; ""
    if it has none."""
    try:
        host = urlsplit(_as_browsers_read(url)).hostname or ""
    except ValueError:
        return ""
    return host.rstrip(".")


def shown_host(url: str) -> str:
    """``_host(url)`` fit to show (a receipt, an error): each label that may be a token
    or hold a code redacted, as ``redact_url`` redacts it (``….app.example.test`` for
    ``483920.app.example.test``)."""
    try:
        parts = urlsplit(_as_browsers_read(url.strip()))
        host = parts.hostname or ""
    except ValueError:
        return ""
    shown = _visible(host) if ":" in host else _untokened_host(parts.netloc, host)
    return shown.rstrip(".")


def domain_as_url(domain: str) -> str:
    """``link(domain=)``'s value as a URL to read its host from: a host, or a URL."""
    return domain if "://" in domain else f"http://{domain}"


def domain_host(domain: str) -> str:
    """The host ``link(domain=)`` looks for links on ("" if ``domain`` names none)."""
    return _host(domain_as_url(domain.strip()))


def _port(url: str, *, default: bool = False) -> int | str | None:
    """The URL's port as written (``default``: its scheme's when none is written), None
    if it has none, ``"unreadable"`` if it is not a number."""
    try:
        parts = urlsplit(_as_browsers_read(url))
        port = parts.port
    except ValueError:
        return "unreadable"
    if port is None and default:
        return _DEFAULT_PORTS.get(parts.scheme.lower())
    return port


_DEFAULT_PORTS = {"http": 80, "https": 443}
#: A host and a port as typed (``localhost:99999``): shown as given, nothing to mask.
_HOST_AND_PORT = re.compile(r"[A-Za-z0-9.-]+:\w+")


def _same_link(url: str) -> str:
    """``url`` as two spellings of one link share it: scheme and host compared as a browser
    compares them (any case, IDNA, no trailing dot), its scheme's default port dropped; the
    rest as written."""
    try:
        parts = urlsplit(_as_browsers_read(url))
        host, port = parts.hostname or "", parts.port
    except ValueError:
        return url
    scheme = parts.scheme.lower()
    userinfo, at, _ = parts.netloc.rpartition("@")
    netloc = f"{userinfo}{at}" + (f"[{host}]" if ":" in host else normalize_domain(host))
    if port is not None and port != _DEFAULT_PORTS.get(scheme):
        netloc += f":{port}"
    return parts._replace(scheme=scheme, netloc=netloc).geturl()


#: Hosts of the click tracking that mail services put in front of a mail's links:
#: SendGrid (``u123.ct.sendgrid.net``), AWS SES (``….r.us-east-1.awstrack.me``), Postmark
#: (``click.pstmrk.it``), Mailchimp, Mandrill, SparkPost, HubSpot.
_TRACKERS = re.compile(
    r"(?:^|\.)(?:ct\.sendgrid\.net|awstrack\.me|pstmrk\.it|list-manage\.com|mandrillapp\.com"
    r"|sparkpostmail\.com|hubspotlinks\.com)$"
)


def _is_tracking(url: str) -> bool:
    """``url`` is a click-tracking redirect: on a tracker's host, on Mailgun's
    (``email.<domain>/c/…``), or holding the URL it leads to in its path (SES's
    ``/L0/https:%2F%2F…``)."""
    host = _host(url)
    path = _path(url)
    return (
        _TRACKERS.search(host) is not None
        or (host.startswith("email.") and path.startswith("/c/"))
        or "://" in unquote(path)
    )


def _tracking_note(links: Iterable[str]) -> str:
    """For ``link()`` that found no link where it looked: the hosts found that are click
    tracking, which leads to the app's link only when followed."""
    hosts = list(dict.fromkeys(shown_host(url) for url in links if _is_tracking(url)))
    if not hosts:
        return ""
    return (
        f"; {', '.join(hosts)} {'is' if len(hosts) == 1 else 'are'} click tracking, whose links "
        "lead to the app's only when followed: turn click tracking off for the mail the "
        "tests send, or pass its host as domain="
    )


def _path(url: str) -> str:
    """The URL's path as ``link(path=)`` compares it ("" if it has none or cannot be read)."""
    try:
        return _plain_path(urlsplit(_as_browsers_read(url)).path)
    except ValueError:
        return ""


def _plain_path(path: str) -> str:
    """``path`` without its segments' ``;parameters`` (``;jsessionid=…``), and decoded
    but for an encoded slash: ``/%76erify`` and ``/caf%C3%A9`` read ``/verify``, ``/café``."""
    path = _PATH_PARAMS.sub("", path)
    return "%2F".join(unquote(part) for part in re.split("%2[Ff]", path))


_PATH_PARAMS = re.compile(r";[^/]*")


def _unwrapped(text: str) -> str:
    """``text`` with each link in angle brackets that a line break cuts made whole."""
    if "<" not in text:
        return text
    return _WRAPPED_URL.sub(lambda m: "<" + _WRAP.sub("", m.group(1)) + ">", text)


def _trim_url(url: str) -> str:
    """Drop sentence punctuation and unbalanced closing brackets that trail a URL in prose."""
    while url:
        last = url[-1]
        if last in _TRAILING or (last in _OPENER and url.count(last) > url.count(_OPENER[last])):
            url = url[:-1]
        else:
            break
    return url


@lru_cache(maxsize=2048)
def _fetch_header(name: str, value: str) -> Any:
    """``email.policy.default``'s header object, cached: the parser re-reads headers a lot."""
    return _DEFAULT.header_fetch_parse(name, value)


if TYPE_CHECKING:
    _EmailPolicy = EmailPolicy[EmailMessage]
else:  # not subscriptable at runtime
    _EmailPolicy = EmailPolicy


class _CachingPolicy(_EmailPolicy):
    """``email.policy.default`` with header parsing memoized (2000 parts parse in ms, not s)."""

    def header_fetch_parse(self, name: str, value: str) -> Any:
        if not isinstance(value, str) or hasattr(value, "name") or len(value) > _MAX_CACHED:
            return super().header_fetch_parse(name, value)
        return _fetch_header(name, value)


_DEFAULT: EmailPolicy[EmailMessage] = EmailPolicy()
_POLICY = _CachingPolicy()


class _HTMLScan(HTMLParser):
    """Collects the visible text and the ``<a href>`` values of an HTML body."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.chunks: list[str] = []
        self.hrefs: list[str] = []
        #: The ``alt`` texts of its images: a code drawn as a picture is written there.
        self.alts: list[str] = []
        #: Where in ``chunks`` a block (a paragraph, a heading, a cell) begins or ends.
        self.breaks: list[int] = []
        self._skipping = 0

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag in _HTML_SKIP:
            self._skipping += 1
        elif tag in _HTML_BLOCK:
            self._break()
        if tag in ("a", "img"):
            wanted, found = ("href", self.hrefs) if tag == "a" else ("alt", self.alts)
            for name, value in attrs:
                if name == wanted and value:
                    found.append(value)
                    break

    def handle_endtag(self, tag: str) -> None:
        if tag in _HTML_SKIP:
            self._skipping = max(0, self._skipping - 1)
        elif tag in _HTML_BLOCK:
            self._break()

    def _break(self) -> None:
        self.breaks.append(len(self.chunks))
        self.chunks.append("\n")

    def handle_data(self, data: str) -> None:
        if not self._skipping:
            self.chunks.append(data)

    @classmethod
    def scan(cls, markup: str) -> _HTMLScan:
        """Parse ``markup`` as far as it goes; broken markup keeps what was read before it."""
        scanner = cls()
        try:
            scanner.feed(markup)
            scanner.close()
        except Exception:  # html.parser raises AssertionError on odd declarations
            pass
        return scanner


@dataclass(frozen=True)
class _Parsed:
    """Everything read from the bytes in one pass, so properties are cheap and never raise."""

    entries: list[tuple[str, str, Any]] = field(default_factory=list)  # name, value, object
    text: str = ""
    html: str = ""
    defects: list[str] = field(default_factory=list)
    #: What ``link()`` and ``code()`` did not read, for their errors to say.
    unread: tuple[str, ...] = ()


def _walk(root: EmailMessage, *, into_attached: bool = True) -> Iterator[EmailMessage]:
    """Every part in document order, without recursion (trees may be thousands deep)."""
    stack = [root]
    while stack:
        part = stack.pop()
        yield part
        try:
            if not part.is_multipart():
                continue
            if not into_attached and part.get_content_maintype() == "message":
                continue
            children = part.get_payload()
        except Exception:  # a part we cannot read has no readable children
            continue
        if isinstance(children, list):
            stack.extend(child for child in reversed(children) if isinstance(child, EmailMessage))


def _find_body(tree: EmailMessage, subtype: str, *, named: bool = False) -> EmailMessage | None:
    """``get_body((subtype,))``, falling back to the first inline ``text/<subtype>`` part;
    never a file (``_is_file``), which ``get_body`` takes for the body when it is not
    marked ``attachment``. With ``named``, a part with a file name not marked
    ``attachment`` may be the body: for a mail whose every text part is named."""
    try:
        found = tree.get_body((subtype,))
    except Exception:  # RecursionError on absurdly deep trees, header parser bugs
        found = None
    if isinstance(found, EmailMessage) and not _is_file(found, tree, named=named):
        return found
    wanted = f"text/{subtype}"
    for part in _walk(tree, into_attached=False):
        try:
            if part.get_content_type() == wanted and not _is_file(part, tree, named=named):
                return part
        except Exception:  # skip parts whose headers cannot be read
            continue
    return None


def _is_file(part: EmailMessage, tree: EmailMessage, *, named: bool = False) -> bool:
    """A part of the mail that is a file attached: marked ``attachment``, or named
    (``Content-Disposition: inline; filename=…``, as Apple Mail attaches a text file, or
    only ``Content-Type: …; name=…``, as older mailers do), unless ``named``: where no
    part without a name is the body, a named one is (Outlook's ``name="body.html"``, a
    TNEF conversion's). The whole mail is its own body, whatever it says."""
    if part is tree:
        return False
    try:
        return part.is_attachment() or (not named and part.get_filename() is not None)
    except Exception:  # a disposition or name that cannot be read: not the body either
        return True


#: A quoted-printable soft line break with white space after its ``=``, which a transport
#: may add and a decoder must drop (RFC 2045 6.7): the email package keeps ``= `` as text.
_PADDED_SOFT_BREAK = re.compile(rb"=[ \t]+(?=\r?\n|$)")
#: The email package's defect for base64 it cannot decode, which it returns undecoded.
_UNDECODABLE = "InvalidBase64LengthDefect"


def _payload(part: EmailMessage) -> bytes | None:
    """The part's payload with its transfer encoding undone, as the email package undoes
    it, but for a quoted-printable soft line break padded with white space, which it kept
    as text (``token=3DZq8x= `` then CRLF: ``link()`` returned the link cut at its ``=``).
    None for base64 that does not decode (a character too many, as a cut-off body has):
    the package returns it undecoded, whose digits ``code()`` could take for a code."""
    payload = part.get_payload(decode=True)
    if not isinstance(payload, bytes):
        return None
    encoding = str(part.get("content-transfer-encoding", "")).strip().lower()
    if encoding == "quoted-printable":
        # As received: get_payload() hands 8-bit text back decoded with the part's charset
        # (``Café`` sent unescaped), which does not encode to ASCII: the body read as none.
        sent = getattr(part, "_payload", None)
        if isinstance(sent, str) and "=" in sent:
            try:
                data = sent.encode("ascii", "surrogateescape")
            except UnicodeEncodeError:  # a part made of text, not parsed from bytes
                return payload
            if _PADDED_SOFT_BREAK.search(data):
                payload = binascii.a2b_qp(_PADDED_SOFT_BREAK.sub(b"=", data))
    elif _bad_base64(part, encoding):
        return None
    return payload


def _decode_part(part: EmailMessage, flags: set[str]) -> str:
    """The part's payload as text: transfer encoding undone, charset applied, newlines '\\n'."""
    try:
        payload = _payload(part)
    except Exception:
        return ""
    if payload is None:
        return ""
    try:
        charset = part.get_content_charset()
    except Exception:
        charset = None
    if charset is None or charset in {"us-ascii", "ascii"}:
        text = _utf8_else_1252(payload)
    else:
        charset = email.charset.ALIASES.get(charset, charset)
        try:
            name = codecs.lookup(charset).name
            if name == "utf-8":
                text = _utf8_else_1252(payload)
            elif name == "iso8859-1":  # read as windows-1252, as browsers read the label
                text = _as_1252(payload)
            else:
                text = payload.decode(charset, "replace")
        except Exception:  # LookupError, or a codec that is not a text codec
            flags.add("unknown_charset")
            text = payload.decode("utf-8", "replace")
    text = _SURROGATE.sub("\ufffd", text).replace("\r\n", "\n").replace("\r", "\n")
    if part.get_content_type() != "text/plain":
        return text
    try:
        flowed = str(part.get_param("format", "")).lower() == "flowed"
        delsp = str(part.get_param("delsp", "")).lower() == "yes"
    except Exception:  # a Content-Type whose parameters cannot be read: as written
        return text
    if flowed:
        text = _unflowed(text, delsp=delsp)
    return _clearsigned(text)


_SIGNED_BEGIN = "-----BEGIN PGP SIGNED MESSAGE-----"
_SIGNATURE_BEGIN = "-----BEGIN PGP SIGNATURE-----"
_SIGNATURE_END = "-----END PGP SIGNATURE-----"


def _clearsigned(text: str) -> str:
    """An OpenPGP cleartext-signed body (RFC 4880 7) as the text it signs: the armor
    headers (``Hash: SHA256``) and the signature dropped, ``- `` dash escapes undone. The
    signature is base64, whose digits between ``+`` and ``/`` read as codes, and its
    ``Comment:`` may hold a link (GPGTools'). Anything else is left as it is."""
    if not text.lstrip().startswith(_SIGNED_BEGIN):
        return text
    lines = text.lstrip().split("\n")
    try:
        # The armor headers end at the first blank line, "zero-length, or containing only
        # whitespace" (RFC 4880 6.2): not at the signed text's first paragraph break.
        start = next(i for i, line in enumerate(lines) if not line.strip()) + 1
        end = next(i for i in range(start, len(lines)) if lines[i].rstrip() == _SIGNATURE_BEGIN)
        close = next(i for i in range(end, len(lines)) if lines[i].rstrip() == _SIGNATURE_END)
    except StopIteration:  # not a whole cleartext signature: as written
        return text
    signed = [line[2:] if line.startswith("- ") else line for line in lines[start:end]]
    return "\n".join([*signed, *lines[close + 1 :]])


def _unflowed(text: str, *, delsp: bool) -> str:
    """``format=flowed`` text (RFC 3676) as its reader shows it: a line that ends in a
    space goes on in the next line of the same quote depth, without that space if
    ``delsp=yes`` (Apple Mail's: a word, or a link, is cut there with no space in it); the
    space stuffed before a line is dropped, and the signature line ``-- `` stays whole."""
    lines: list[str] = []
    open_depth: int | None = None  # the quote depth of a paragraph still flowing
    for line in text.split("\n"):
        body = line.lstrip(">")
        depth = len(line) - len(body)
        stuffed = body.startswith(" ")
        if stuffed:
            body = body[1:]
        flows = body.endswith(" ") and body != "-- "
        if flows and delsp:
            body = body[:-1]
        if open_depth == depth:
            lines[-1] += body
        else:
            lines.append(line[:depth] + (" " if depth and stuffed else "") + body)
        open_depth = depth if flows else None
    return "\n".join(lines)


def _utf8_else_1252(payload: bytes) -> str:
    """UTF-8, each byte that is not UTF-8 read as windows-1252 (Latin-1 where that has no
    character), as a mailer meant it that wrote its ``—`` or ``é`` so under a ``utf-8``
    label or none: an em dash after a link (0x97) was ``U+FFFD`` or a C1 control, which
    ``link()`` took for the link's own."""
    text = payload.decode("utf-8", "surrogateescape")
    if not _ESCAPED_BYTES.search(text):
        return text
    return _ESCAPED_BYTES.sub(lambda run: "".join(map(_char_1252, run.group())), text)


def _as_1252(payload: bytes) -> str:
    """``payload`` as windows-1252, which the WHATWG Encoding Standard reads a Latin-1
    label as (mailers write cp1252's ``—`` under it); Latin-1 if it has bytes cp1252 has
    no character for."""
    try:
        return payload.decode("cp1252")
    except UnicodeDecodeError:
        return payload.decode("latin-1")


def _char_1252(escaped: str) -> str:
    byte = bytes([ord(escaped) - 0xDC00])
    try:
        return byte.decode("cp1252")
    except UnicodeDecodeError:  # 0x81, 0x8D, 0x8F, 0x90, 0x9D: none in windows-1252
        return byte.decode("latin-1")


def _header(name: str, raw: object) -> tuple[str, Any]:
    """A header's decoded, unfolded value and its parsed object (None if it did not parse,
    or was too long to parse: shown as sent, encoded words and all)."""
    value = raw if isinstance(raw, str) else str(raw)
    unfolded = _clean(_FOLD.sub(" ", value))  # raw 8-bit bytes: UTF-8, else Latin-1
    if len(unfolded) > MAX_PARSED_HEADER:
        return _LINEBREAKS.sub("", unfolded), None
    try:
        parsed = _POLICY.header_fetch_parse(name, unfolded)
        return _clean(str(parsed)), parsed
    except Exception:
        return _LINEBREAKS.sub("", unfolded), None


def _parse(raw: bytes) -> _Parsed:
    """Parse the bytes once; whatever fails is recorded in ``defects`` instead of raised."""
    flags: set[str] = set()
    try:
        tree: EmailMessage | None = BytesParser(policy=_POLICY).parsebytes(raw)
    except Exception:  # RecursionError on absurd nesting, bugs in the email package
        flags.add("parse_error")
        try:
            tree = BytesParser(policy=_POLICY).parsebytes(raw, headersonly=True)
        except Exception:
            tree = None
    if tree is None:
        return _Parsed(defects=sorted(flags))

    entries: list[tuple[str, str, Any]] = []
    try:
        raw_headers = list(tree.raw_items())
    except Exception:
        raw_headers = []
    for name, value in raw_headers:
        if isinstance(value, str) and _SURROGATE.search(value):
            flags.add("8bit_header")
        text, parsed = _header(name, value)
        entries.append((name, text, parsed))
        flags.update(type(defect).__name__ for defect in getattr(parsed, "defects", ()))

    plain = _find_body(tree, "plain")
    markup = _find_body(tree, "html")
    if plain is None and markup is None:  # every text part named: some mailers name the body
        plain = _find_body(tree, "plain", named=True)
        markup = _find_body(tree, "html", named=True)
    text = _decode_part(plain, flags) if plain is not None else ""
    html = _decode_part(markup, flags) if markup is not None else ""
    for part in _walk(tree):  # after decoding: bad base64 is only noticed while decoding
        flags.update(type(defect).__name__ for defect in getattr(part, "defects", ()))
    unread = _unread(tree, (plain, markup))
    return _Parsed(entries=entries, text=text, html=html, defects=sorted(flags), unread=unread)


#: The text parts ``link()`` and ``code()`` read when they are the body (``_find_body``).
_BODY_KINDS = frozenset({"text/plain", "text/html"})
#: The machine-readable part of a ``multipart/report`` (RFC 3464, RFC 8098), and their
#: internationalized forms (RFC 6533, as an SMTPUTF8 mail's bounce is sent).
_REPORTS = frozenset(
    {
        "message/delivery-status",
        "message/disposition-notification",
        "message/global-delivery-status",
        "message/global-disposition-notification",
    }
)
#: A bounce's copy of the original's headers, not a message (RFC 6522, RFC 6533).
_HEADERS_COPY = frozenset({"text/rfc822-headers", "message/global-headers"})


def _unread(tree: EmailMessage, bodies: tuple[EmailMessage | None, ...]) -> tuple[str, ...]:
    """What a mail holds that ``link()`` and ``code()`` do not read: a body whose base64
    does not decode, a message attached (a forward, a bounce's copy), text attached as a
    file, text of another kind (an invitation's ``text/calendar``, ``text/x-amp-html``)."""
    found: dict[str, None] = {}
    for body in bodies:
        if body is not None and _undecoded(body):
            found[f"its {body.get_content_type()} body, whose base64 does not decode "
                  f"({_UNDECODABLE}: cut short?)"] = None  # fmt: skip
    for part in _walk(tree, into_attached=False):
        try:
            kind = part.get_content_type()
            if part in bodies:
                continue
            if kind in _REPORTS:  # a bounce's or a read receipt's report, not a mail
                found[f"its report ({kind})"] = None
            elif kind in _HEADERS_COPY:
                found[f"its {kind} part"] = None
            elif kind.startswith("message/"):  # the whole mail, too: a bounce, a forward
                found[f"an attached message ({kind})"] = None
            elif kind.startswith("text/") and _is_file(part, tree):
                found[f"an attached file ({kind})"] = None
            elif kind.startswith("text/") and kind not in _BODY_KINDS:
                found[f"its {kind} part"] = None  # an invitation's text/calendar, AMP
        except Exception:  # a part whose headers cannot be read
            continue
    return tuple(found)


def _searched(pattern: str | None, texts: tuple[str, ...]) -> tuple[str, ...]:
    """``texts`` as ``code()`` searches them: the default pattern looks outside links, and
    not in a date, a time, or a copyright's year (``© 2026``); a pattern given, in all."""
    if pattern is not None:
        return texts
    return tuple(
        _NOT_CODES.sub(
            " ", _DATE_OR_TIME.sub(" ", _URL_TO_REDACT.sub(" ", _invisible_out(_unwrapped(text))))
        )
        for text in texts
    )


#: An invisible format character between two digits (a zero-width space, joiner or
#: non-joiner, a word joiner, a byte order mark, a soft hyphen, a direction mark or
#: override): a reader sees one number where ``\d`` sees two, and ``1234\u200b56`` gave the
#: code ``1234``. The default pattern reads the digits as one run: the code as the app wrote
#: it, or none (too long) rather than a part of it.
_INVISIBLE = r"[\u00ad\u061c\u180e\u200b-\u200f\u202a-\u202e\u2060-\u2064\u2066-\u2069\ufeff]"
_INVISIBLE_IN_DIGITS = re.compile(rf"(?<=\d){_INVISIBLE}+(?=\d)")
#: A character reference in HTML's source (``&zwnj;``, ``&#8203;``, ``&#x200B;``).
_CHARACTER_REFERENCE = r"&(?:#[0-9]{1,7}|#[xX][0-9a-fA-F]{1,6}|[A-Za-z]{2,32});?"


def _invisible_out(text: str) -> str:
    """``text`` without the invisible characters between digits (``_INVISIBLE_IN_DIGITS``)."""
    return _INVISIBLE_IN_DIGITS.sub("", text) if not text.isascii() else text


def _undecoded(part: EmailMessage) -> bool:
    """A body part ``_payload`` found undecodable (it was decoded before: the email
    package records the defect then)."""
    try:
        encoding = str(part.get("content-transfer-encoding", "")).strip().lower()
    except Exception:
        return False
    return _bad_base64(part, encoding)


def _bad_base64(part: EmailMessage, encoding: str) -> bool:
    """A base64 part the email package could not decode (the defect it records then)."""
    return encoding == "base64" and any(type(d).__name__ == _UNDECODABLE for d in part.defects)


@dataclass(frozen=True)
class Index:
    """What the sink stores beside a message's bytes, read from its header section only."""

    subject: str
    run_header: str | None
    defects: list[str]


#: A header section the fast path may read: printable ASCII and tabs, CRLF line ends, every
#: line a ``name:value`` field or the continuation of one, then the blank line.
_PLAIN_SECTION = re.compile(rb"[!-9;-~]+:[\t -~]*\r\n(?:(?:[!-9;-~]+:|[\t ])[\t -~]*\r\n)*\r\n")
_INDEXED = ("subject", "x-run-id")
#: Two line ends in a row, by the parser's rules (CRLF, CR or LF): where headers end.
_EMPTY_LINE = re.compile(rb"(?:\r\n|\r(?!\n)|\n)(?:\r\n|\r(?!\n)|\n)")


def index(raw: bytes) -> Index:
    """The subject, the ``X-Run-Id`` and defects of the header section, without the body:
    ``8bit_header``, and what the parser found in those two headers.

    A message's index and the ``Message`` a test reads must agree on every header: a plain
    header section (printable ASCII, no encoded words) is read directly, by the rules the
    parser applies to it; anything else goes through the same parser and policy as
    ``Message``, stopped at the end of the header section. Defects in the body (broken MIME
    boundaries, bad base64, unknown charsets) are found when the message is read
    (``Message.defects``), not while the client waits for its ``250``.
    """
    plain = _PLAIN_SECTION.match(raw)
    if plain is not None and b"=?" not in plain.group():
        found: dict[str, str] = {}
        key = value = ""
        for line in plain.group().decode("ascii").split("\r\n"):
            if line[:1] in (" ", "\t"):  # a continuation: unfolded to one space, as _header does
                if key in _INDEXED and key not in found:
                    value += " " + line.lstrip(" \t")
                continue
            if key in _INDEXED and key not in found:  # the field before this line is complete
                found[key] = value.strip()
            name, _, value = line.partition(":")
            key = name.lower()
        return Index(found.get("subject", ""), found.get("x-run-id"), [])
    # The parser, headers only, still splits every line of the body: hand it the header
    # section alone (up to the first empty line, CRLF never split into CR and LF).
    end = _EMPTY_LINE.search(raw)
    return _index_parsed(raw if end is None else raw[: end.end()])


def _index_parsed(raw: bytes) -> Index:
    """``index`` by the parser, for header sections that are not plain."""
    flags: set[str] = set()
    try:
        tree = BytesParser(policy=_POLICY).parsebytes(raw, headersonly=True)
        raw_headers = list(tree.raw_items())
    except Exception:  # bugs in the email package: index nothing, deliver anyway
        return Index(subject="", run_header=None, defects=["parse_error"])
    found: dict[str, str] = {}
    for name, value in raw_headers:
        if isinstance(value, str) and _SURROGATE.search(value):
            flags.add("8bit_header")
        key = name.lower()
        if key in _INDEXED and key not in found:
            text, parsed = _header(name, value)
            found[key] = text.strip()
            flags.update(type(defect).__name__ for defect in getattr(parsed, "defects", ()))
    return Index(found.get("subject", ""), found.get("x-run-id"), sorted(flags))


def _addresses(value: str, parsed: Any) -> list[str]:
    """The addr-specs of an address header, with a lenient regex when the parser found none."""
    found: list[str] = []
    try:
        for address in getattr(parsed, "addresses", ()):
            spec = _clean(str(address.addr_spec))
            if "@" in spec and spec not in found:
                found.append(spec)
    except Exception:
        found = []
    return found or list(dict.fromkeys(_ADDRESS.findall(value)))


class Message:
    """A parsed, read-only view of one stored message (``email.policy.default`` semantics)."""

    def __init__(
        self,
        raw: bytes,
        *,
        message_id: str = "",
        envelope_from: str = "",
        envelope_to: str = "",
        received_at: datetime | None = None,
        seq: int = 0,
        on_secret: Callable[[str, str, str | None], None] | None = None,
    ) -> None:
        self.raw = bytes(raw)
        self.message_id = message_id
        self.envelope_from = envelope_from
        self.envelope_to = envelope_to
        self.received_at = received_at
        self.seq = seq
        self._on_secret = on_secret
        self._parsed_cache: _Parsed | None = None
        #: How code() found each code written in groups (``483920``: ``{"483 920"}``).
        self._written: dict[str, set[str]] = {}

    def __repr__(self) -> str:
        # Masked before it is cut (a token cut short is still one), with what this process
        # extracted lately: a repr may be printed anywhere.
        subject = mask_extracted(mask_subject(self.subject))
        if len(subject) > _REPR_SUBJECT:
            subject = subject[: _REPR_SUBJECT - 3] + "..."
        sender = _visible(mask_extracted(mask_address(self.sender))) if self.sender else "-"
        return f"<Message {self._label} from={sender} subject={subject!r}>"

    # -- parsing ---------------------------------------------------------------------------

    @property
    def _parsed(self) -> _Parsed:
        if self._parsed_cache is None:
            self._parsed_cache = _parse(self.raw)
        return self._parsed_cache

    @property
    def _label(self) -> str:
        return self.message_id or f"#{self.seq}"

    def _values(self, name: str) -> list[tuple[str, Any]]:
        wanted = name.strip().lower()
        return [(text, obj) for key, text, obj in self._parsed.entries if key.lower() == wanted]

    # -- headers ---------------------------------------------------------------------------

    @property
    def headers(self) -> list[tuple[str, str]]:
        """Every header as (name, decoded value), in order."""
        return [(name, text) for name, text, _ in self._parsed.entries]

    def header(self, name: str) -> str | None:
        """The first value of header ``name`` (case-insensitive), or None."""
        values = self._values(name)
        return values[0][0] if values else None

    def run_header(self, name: str = "X-Run-Id") -> str | None:
        """The stripped value of the run-correlation header, or None."""
        value = self.header(name)
        return value.strip() if value is not None else None

    @cached_property
    def subject(self) -> str:
        """The decoded subject ("" if missing), folded whitespace turned into single spaces."""
        value = self.header("Subject")
        return value.strip() if value is not None else ""

    @cached_property
    def sender(self) -> str:
        """The From address (addr-spec only, e.g. ``noreply@app.example.test``), or ""."""
        for value, parsed in self._values("From"):
            found = _addresses(value, parsed)
            if found:
                return found[0]
        return ""

    @property
    def to(self) -> list[str]:
        """The addresses of the To header(s)."""
        return list(self._to)

    @cached_property
    def _to(self) -> tuple[str, ...]:
        found: dict[str, None] = {}
        for value, parsed in self._values("To"):
            found.update(dict.fromkeys(_addresses(value, parsed)))
        return tuple(found)

    # -- bodies ----------------------------------------------------------------------------

    @property
    def text(self) -> str:
        """The text/plain body, decoded; "" if there is none."""
        return self._parsed.text

    @property
    def html(self) -> str:
        """The text/html body, decoded; "" if there is none."""
        return self._parsed.html

    @cached_property
    def _html_scan(self) -> _HTMLScan:
        return _HTMLScan.scan(self.html)

    @cached_property
    def body_text(self) -> str:
        """The plain body, or the HTML body as plain text when there is none: what is searched."""
        if self.text.strip():
            return self.text
        return self._html_text

    @property
    def defects(self) -> list[str]:
        """How the mail is malformed: email-package defect names plus our own flags, sorted."""
        return list(self._parsed.defects)

    # -- extraction ------------------------------------------------------------------------

    @cached_property
    def _links(self) -> tuple[str, ...]:
        # By the page a browser visits: the text and the HTML part may spell one link's
        # host two ways (``App.Example.Test``, IDNA, its scheme's port written out).
        found: dict[str, str] = {}
        for match in _URL_IN_TEXT.finditer(_unwrapped(self.text)):
            url = _trim_url(match.group())
            if _host(url):
                found.setdefault(_same_link(url), url)
        for href in self._html_scan.hrefs:
            url = _URL_CONTROL.sub("", href).strip()
            if _HTTP_SCHEME.match(url) and _host(url):
                found.setdefault(_same_link(url), url)
        return tuple(found.values())

    def links(self) -> list[str]:
        """Distinct http(s) links: those in the text body, then new ones from HTML ``<a href>``.

        The parts of them that may be tokens are masked in the running test's report, as
        an extracted link's are; only ``link()`` records one in the receipt.
        """
        remember_listed(self._links)
        return list(self._links)

    def link(self, domain: str | None = None, *, path: str | None = None) -> str:
        """The one distinct link on ``domain`` (any host if None) whose path is ``path`` or
        lies under it (``path="/verify"``: ``/verify``, ``/verify/abc?t=1``, not
        ``/verifyx``); ExtractionError otherwise."""
        __tracebackhide__ = True
        return self._one_link(*self._link_candidates(domain, path))

    def _link_candidates(
        self, domain: str | None, path: str | None, hosts: set[str] | None = None
    ) -> tuple[list[str], str, str]:
        """The links on ``domain`` (or on ``hosts``) under ``path``, what they were looked
        for on, and what to narrow them with: the arguments of ``_one_link``."""
        __tracebackhide__ = True
        where, hint = "", "pass domain= or path= (path='/verify')"
        if hosts is not None:
            candidates = self._links_on(hosts)
        elif domain is None:
            candidates = list(self._links)
        else:
            given = "" if not isinstance(domain, str) else domain.strip()
            url = domain_as_url(given)
            wanted = _host(url)
            port = _port(url)
            if wanted and isinstance(port, str):
                shown = given if _HOST_AND_PORT.fullmatch(given) else mask_copied(given)
                msg = (
                    f"link(domain={shown!r}): its port is not a port (a number 0..65535); "
                    "give the host alone, or the host and its port ('localhost:8000')"
                )
                raise ExtractionError(msg, result={"message_id": self.message_id})
            if not wanted:
                shown = repr(mask_copied(domain)) if isinstance(domain, str) else repr(domain)
                msg = f"link(domain={shown}): give a host name such as 'app.example.test'"
                raise ExtractionError(msg, result={"message_id": self.message_id})
            if _path(url).strip("/") or any(c in url for c in "?#"):  # it would be ignored
                # As link(domain=) takes it back: an IPv6 host in brackets ('[::1]:8000').
                host = mask_copied(wanted)
                host = f"[{host}]" if ":" in host and port is None else host
                host = host if port is None else address(host, port)
                msg = (
                    f"link(domain={mask_copied(given)!r}): give the host alone "
                    f"(domain={host!r}) and the start of the path as path=, "
                    "such as path='/verify'"
                )
                raise ExtractionError(msg, result={"message_id": self.message_id})
            candidates, where = self._links_on({wanted}), f" on {shown_host(url)}"
            if port is not None:  # given: only links on that port ("localhost:8000")
                candidates = [u for u in candidates if _port(u, default=True) == port]
                where = f" on {address(shown_host(url), port)}"
            hint = "pass path= with the start of the one you want (path='/verify')"
        if path is not None:
            if not isinstance(path, str) or not path.startswith("/") or "?" in path or "#" in path:
                shown = repr(mask_copied(path)) if isinstance(path, str) else repr(path)
                msg = (
                    f"link(path={shown}): give the start of a URL path, such as "
                    "'/verify' (no query or fragment)"
                )
                raise ExtractionError(msg, result={"message_id": self.message_id})
            under = _plain_path(path).rstrip("/") + "/"
            candidates = [u for u in candidates if (_path(u) + "/").startswith(under)]
            where += f" under {mask_copied(path)!r} (from the path's start: '/en/verify' is not)"
            hint = "pass a longer path="
        return candidates, where, hint

    def _links_on(self, hosts: set[str]) -> list[str]:
        """The links on one of ``hosts``, compared as domains are (IDNA, lower case)."""
        wanted = {normalize_domain(host) for host in hosts}
        return [u for u in self._links if normalize_domain(_host(u)) in wanted]

    def _one_link(self, candidates: list[str], where: str, hint: str) -> str:
        """The one link among ``candidates`` (recorded as a secret), or why there is none."""
        __tracebackhide__ = True
        found = self._links
        result: dict[str, Any] = {
            "message_id": self.message_id,
            "kind": "link",
            "candidates": len(candidates),
        }
        if len(candidates) == 1:
            url = candidates[0]
            if self._on_secret is not None:
                self._on_secret("link", url, shown_host(url) or None)
            return url
        if not candidates:
            hosts = list(dict.fromkeys(shown_host(u) for u in found))
            msg = f"no link{where} in message {self._label}; hosts found: "
            unread = self._unread_note()
            msg += ", ".join(hosts) if hosts else "none"
            msg += unread or ("" if hosts else " (the message has no http(s) links)")
            msg += _tracking_note(found)
            raise ExtractionError(msg, result={**result, "hosts": hosts})
        shown = ", ".join(redact_url(u) for u in candidates[:_MAX_LISTED])
        if len(candidates) > _MAX_LISTED:
            shown += f", … and {len(candidates) - _MAX_LISTED} more"
        msg = (
            f"{len(candidates)} distinct links{where} in message {self._label}, expected "
            f"exactly one: {shown}; {hint}, or choose from message.links()"
        )
        raise ExtractionError(msg, result=result)

    def _code_values(
        self, source: str, pattern: str | None, texts: tuple[str, ...], text: str
    ) -> dict[str, None]:
        """The values ``source`` finds in ``texts`` (for the default pattern, as
        ``_searched`` leaves them): for the default pattern, then glued to words where none
        stands alone; for a pattern given, in an HTML body's hrefs where its text
        (``text``: the text part) has none."""
        __tracebackhide__ = True
        values = self._codes(source, texts, given=pattern is not None)
        if not values and pattern is not None and not text.strip():
            # The HTML body was searched: its links are in its hrefs, which its text leaves
            # out. Looked in only when the text has no match: a pattern that found the one
            # code of the text (r"(\d{6})") finds it still, beside an unsubscribe link's id.
            hrefs = tuple(_URL_CONTROL.sub("", href) for href in self._html_scan.hrefs)
            values = self._codes(source, hrefs, given=True)
        if not values and pattern is None:
            values = self._codes(_GLUED_CODE_PATTERN, texts, given=False)
        return values

    def _spaced_codes(self, texts: tuple[str, ...]) -> dict[str, None]:
        """The codes written in groups (``_SPACED_CODE``) in ``texts``, each as its digits
        (``483920``, what a code's form takes); how each was written is kept, for the
        test's report to mask that too."""
        __tracebackhide__ = True
        values: dict[str, None] = {}
        for haystack in texts:
            try:
                found = regex_finditer(_SPACED_CODE, haystack)
            except SlowSearch:  # pragma: no cover - not backtracking: a text of numbers
                raise self._too_many_numbers(len(haystack)) from None
            for match in found:
                value = _NOT_DIGIT.sub("", match.group())
                if match.group("one") and value in _SCALE:
                    continue  # a survey's scale, a cell a point (1 2 3 4 5 6 7): no code
                values.setdefault(value, None)
                self._written.setdefault(value, set()).add(match.group())
        return values

    def _written_forms(self, value: str) -> set[str]:
        """How the bodies write ``value``, a code ``code()`` found in groups: as it read it
        (``483 920``), and as the HTML's source or the text part has it
        (``483&nbsp;920``, ``483\u00a0920``, ``<b>483</b>\n<b>920</b>``), which a test
        that shows ``msg.html`` puts in its report."""
        forms = set(self._written.get(value, ()))
        if value.isdigit():  # split by invisible characters (``1234\u200b56``): masked so too
            # The HTML's source may write one as a reference (``7316&zwnj;04``, ``&#8203;``).
            between = f"(?:{_INVISIBLE}|{_CHARACTER_REFERENCE})*"
            split = re.compile(rf"(?<!\d){between.join(value)}(?!\d)")
            for body in (self.text, self.html, self.subject):
                if not body.isascii() or "&" in body:
                    split_in = itertools.islice(split.finditer(body), _WRITTEN_FORMS)
                    forms.update(
                        m.group()
                        for m in split_in
                        if m.group() != value and _invisible_out(unescape(m.group())) == value
                    )
        for written in tuple(forms):
            groups = _GROUP.findall(written)
            joined = _WRITTEN_JOINER.join(re.escape(group) for group in groups)
            found = re.compile(rf"(?<!\d){joined}(?!\d)")
            for body in (self.html, self.text):
                # The first few of each body: one that wrote it in thousands of ways
                # (tags between its groups) would grow the report's mask with each.
                written_in = itertools.islice(found.finditer(body), _WRITTEN_FORMS)
                forms.update(match.group() for match in written_in)
        # A form over lines (``<b>483</b>\n    <b>920</b>``) is shown a line at a time by
        # pytest's diff of ``msg.html``: each line's piece holding a group is masked too.
        for form in tuple(forms):
            lines = form.splitlines()
            if len(lines) > 1:
                forms.update(line.strip() for line in lines if _GROUP.search(line))
        return forms

    @cached_property
    def _html_text(self) -> str:
        """The HTML body as plain text, as ``body_text`` reads it when there is no text part:
        its blocks joined by one space (a break between them is a line break, one space)."""
        return " ".join(self._html_blocks)

    @cached_property
    def _html_blocks(self) -> tuple[str, ...]:
        """The HTML body's text a block at a time (a heading, a paragraph, a cell), its
        whitespace runs each one space: joined by one space, they are ``_html_text``."""
        chunks = self._html_scan.chunks
        blocks, start = [], 0
        for end in (*self._html_scan.breaks, len(chunks)):
            block = " ".join("".join(chunks[start:end]).split())
            if block:
                blocks.append(block)
            start = end + 1
        return tuple(blocks)

    def _searched_html(self, pattern: str | None) -> str:
        """The HTML body's text as ``code()`` searches it (``_searched``): for the default,
        what is no code is taken out of each block alone, so that a heading's last word
        and the next block's number (``Verify your account`` / ``482913``) are not read
        as one (an account's number), as the text joined by spaces reads them; a block of
        one digit (a cell of a code written a digit a cell) is joined by a line break to
        one that is not."""
        if pattern is not None:
            return self._html_text
        blocks = self._html_blocks
        searched = _searched(None, blocks)
        if len(searched) < 2:
            return "".join(searched)
        # A code one digit a cell reads ``4 8 2 9 1 3``: the digits of the blocks beside
        # it are none of its own (``Step 2``, ``5 items in cart``), a line break apart.
        joined = [searched[0]]
        for before, block, text in zip(blocks, blocks[1:], searched[1:], strict=False):
            apart = (len(before) == 1 and before.isdigit()) != (len(block) == 1 and block.isdigit())
            joined += ["\n" if apart else " ", text]
        return "".join(joined)

    def _letters_hint(self, texts: tuple[str, ...]) -> str:
        """For a default search that found no code: the pattern that takes a code of
        capitals and digits the texts show (``K7Q-9PX``, masked), or a pattern to write.
        First, a number after ``#`` (an order's, as the default reads it) that may be it."""
        for text in texts:
            found = _HASH_NUMBER.search(text)
            if found is not None:
                return (
                    f"; a number after # is read as an order's, not a code "
                    f"(#{_mask(found.group(1))}): if it is the code, pass "
                    f'pattern=r"#(\\d{{{len(found.group(1))}}})"'
                )
        for text in texts:
            found = _LETTER_CODE.search(text)
            if found is not None:
                shape = _LETTER_RUN.sub(
                    lambda run: f"[A-Z0-9]{{{len(run.group())}}}", found.group()
                )
                shown = _mask(found.group())
                return (
                    f"; capitals and digits that may be the code are shown ({shown}): "
                    f'if they are, pass pattern=r"\\b({shape})\\b"'
                )
        return '; for a code of another shape pass pattern=, e.g. r"code: ([A-Z0-9]{6})"'

    def _unread_note(self) -> str:
        """For an error that found nothing: what of the mail was not read, if anything."""
        unread = self._parsed.unread
        return f"; not read: {', '.join(unread)}" if unread else ""

    def _too_many_numbers(self, length: int) -> ExtractionError:
        """The default's search of a text of ``length`` characters ran out of time: not
        backtracking, a text of numbers too many to read; a ``pattern=`` reads fewer."""
        msg = (
            f"code() took more than {SEARCH_LIMIT:g}s to read the numbers of a text of "
            f"{length:,} characters; pass pattern= with what stands around the code, e.g. "
            'pattern=r"code: (\\d{6})"'
        )
        return ExtractionError(msg, result={"message_id": self.message_id})

    def _codes(self, source: str, texts: tuple[str, ...], *, given: bool) -> dict[str, None]:
        """The distinct values ``source`` finds in ``texts`` (group 1 if it has one)."""
        __tracebackhide__ = True
        groups = re.compile(source).groups
        values: dict[str, None] = {}
        for haystack in texts:
            try:
                found = regex_finditer(source, haystack)
            except SlowSearch:
                if not given:  # not backtracking: a text of numbers, too many to read
                    raise self._too_many_numbers(len(haystack)) from None
                msg = slow_search_text("code(pattern", f"{_show(source)})", len(haystack))
                raise ExtractionError(msg, result={"message_id": self.message_id}) from None
            for match in found:
                value = match.group(1) if groups else match.group()
                if value:
                    values.setdefault(value, None)
        return values

    def code(self, pattern: str | None = None) -> str:
        """The one distinct code matching ``pattern`` (group 1 if it has one) in body or subject
        (a ``pattern`` given also looks inside links: an HTML body's hrefs, where its text
        has no match).

        Zero or several distinct values raise ExtractionError; values are shown masked only.
        """
        __tracebackhide__ = True
        if pattern is not None and not isinstance(pattern, str):
            msg = (
                f"code(pattern={pattern!r}) is refused: a pattern is a str, a regular "
                'expression such as r"code: (\\d{6})"'
            )
            raise ExtractionError(msg, result={"message_id": self.message_id})
        source = DEFAULT_CODE_PATTERN if pattern is None else pattern
        # Checked as a selector's pattern is: invalid, or one that may backtrack for hours.
        problem = None if pattern is None else _regex_problem(source)
        if problem is not None:
            msg = f"code(pattern={_show(source)}) is refused: {problem}"
            raise ExtractionError(msg, result={"message_id": self.message_id})
        # The default looks outside links only; a pattern of the test's own may aim inside
        # one (pattern=r"code=(\d+)"). Digits glued to a word count if nothing else does.
        html_only = not self.text.strip()  # the body is the HTML's: read a block at a time
        body = self._searched_html(pattern) if html_only else _searched(pattern, (self.text,))[0]
        texts = (body, *_searched(pattern, (self.subject,)))
        values = self._code_values(source, pattern, texts, self.text)
        html: tuple[str, ...] = ()
        if not values and self.html.strip() and _is_stub(self.text):
            # A text part with no code at all may be a stub ("view this mail in your
            # browser") beside the HTML that holds it: the HTML part is read then. Not
            # beside a text part of its own words, whose HTML adds a footer's phone
            # number, an order's number or a price: that mail has no code.
            html = (self._searched_html(pattern),)
            values = self._code_values(source, pattern, html, "")
        if not values and pattern is None:
            # A code in groups (``483 920``), once neither the text nor the HTML has one
            # standing alone or glued to a word: a footer's ``Order 123-456`` or ``100 000
            # points`` is no code beside ``Code482913``.
            values = self._spaced_codes(texts) or self._spaced_codes(html)
        if not values and pattern is None and (html or html_only):
            # Last, in the HTML read: an image's alt text, where a code drawn as a picture
            # is written for those who do not see it (``<img alt="843027">``).
            values = self._codes(source, _searched(None, tuple(self._html_scan.alts)), given=False)
        result: dict[str, Any] = {
            "message_id": self.message_id,
            "kind": "code",
            "candidates": len(values),
        }
        if len(values) == 1:
            value = next(iter(values))
            if self._on_secret is not None:
                self._on_secret("code", value, None)
                for written in self._written_forms(value):  # ``483 920``: masked as well
                    remember_extracted("code", written)
            return value
        # The default in words: its regular expression tells a reader of the error little.
        shown = _show(source) if pattern is not None else _DEFAULT_CODE_SHOWN
        if not values:
            msg = f"no code matching {shown} in the subject or body of message {self._label}"
            if pattern is None:
                msg += self._letters_hint(texts + html)
            msg += self._unread_note()
            raise ExtractionError(msg, result=result)
        masked = ", ".join(_mask(v) for v in list(values)[:_MAX_LISTED])
        if len(values) > _MAX_LISTED:
            masked += f", … and {len(values) - _MAX_LISTED} more"
        msg = (
            f"{len(values)} distinct codes match {shown} in message {self._label}: "
            f"{masked}; "
            'pass pattern= with a capture group to pick one, e.g. pattern=r"code: (\\d{6})"'
        )
        raise ExtractionError(msg, result=result)
