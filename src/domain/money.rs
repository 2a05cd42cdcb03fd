//! Money: amounts in integer minor units (never floats) and ISO 4217
//! currency codes.

use std::fmt;

/// A charge amount in minor units (cents for USD), 1 ..= `Amount::MAX`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct Amount(i64);

impl Amount {
    /// 999,999,999.99 in a two-decimal currency. The schema checks the same.
    pub const MAX: i64 = 99_999_999_999;

    pub fn new(minor_units: i64) -> Option<Self> {
        (1..=Self::MAX)
            .contains(&minor_units)
            .then_some(Self(minor_units))
    }

    pub fn minor_units(self) -> i64 {
        self.0
    }
}

/// An active ISO 4217 currency code, kept in upper case. Parsing accepts any
/// case (`usd` is `USD`), as clients written against other payment APIs
/// send lower case.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Currency([u8; 3]);

// Active ISO 4217 codes (list amendment 179), excluding funds codes, precious
// metals and testing codes, which no card processor settles. Kept by hand:
// the iso_currency crate (checked at 0.7.1) marks VES as superseded by VED,
// while ISO 4217 lists both as active and processors still settle VES; a
// wrong list would refuse real payments. Sorted, for the binary search of
// `Currency::parse` (a test checks).
const CODES: &[&str] = &[
    "AED", "AFN", "ALL", "AMD", "AOA", "ARS", "AUD", "AWG", "AZN", "BAM", "BBD", "BDT", "BGN",
    "BHD", "BIF", "BMD", "BND", "BOB", "BRL", "BSD", "BTN", "BWP", "BYN", "BZD", "CAD", "CDF",
    "CHF", "CLP", "CNY", "COP", "CRC", "CUP", "CVE", "CZK", "DJF", "DKK", "DOP", "DZD", "EGP",
    "ERN", "ETB", "EUR", "FJD", "FKP", "GBP", "GEL", "GHS", "GIP", "GMD", "GNF", "GTQ", "GYD",
    "HKD", "HNL", "HTG", "HUF", "IDR", "ILS", "INR", "IQD", "IRR", "ISK", "JMD", "JOD", "JPY",
    "KES", "KGS", "KHR", "KMF", "KPW", "KRW", "KWD", "KYD", "KZT", "LAK", "LBP", "LKR", "LRD",
    "LSL", "LYD", "MAD", "MDL", "MGA", "MKD", "MMK", "MNT", "MOP", "MRU", "MUR", "MVR", "MWK",
    "MXN", "MYR", "MZN", "NAD", "NGN", "NIO", "NOK", "NPR", "NZD", "OMR", "PAB", "PEN", "PGK",
    "PHP", "PKR", "PLN", "PYG", "QAR", "RON", "RSD", "RUB", "RWF", "SAR", "SBD", "SCR", "SDG",
    "SEK", "SGD", "SHP", "SLE", "SOS", "SRD", "SSP", "STN", "SVC", "SYP", "SZL", "THB", "TJS",
    "TMT", "TND", "TOP", "TRY", "TTD", "TWD", "TZS", "UAH", "UGX", "USD", "UYU", "UZS", "VES",
    "VND", "VUV", "WST", "XAF", "XCD", "XCG", "XOF", "XPF", "YER", "ZAR", "ZMW", "ZWG",
];

impl Currency {
    pub fn parse(code: &str) -> Option<Self> {
        let bytes: [u8; 3] = code.as_bytes().try_into().ok()?;
        let upper = bytes.map(|b| b.to_ascii_uppercase());
        let text = std::str::from_utf8(&upper).ok()?;
        // A scan of the list cost 5k instructions per request, 2.6 % of a
        // new charge; the list is sorted (a test checks it), so halve it.
        CODES.binary_search(&text).is_ok().then_some(Self(upper))
    }

    /// Every code accepted, in upper case (the OpenAPI document lists them).
    pub fn codes() -> &'static [&'static str] {
        CODES
    }

    pub fn as_str(&self) -> &str {
        // Only ever built from one of the ASCII codes above.
        std::str::from_utf8(&self.0).unwrap_or("XXX")
    }
}

impl fmt::Display for Currency {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_listed_codes_are_the_accepted_ones() {
        let codes = Currency::codes();
        assert!(codes.len() > 100, "{} codes", codes.len());
        for code in codes {
            let parsed = Currency::parse(code).expect("a listed code parses");
            assert_eq!(parsed.as_str(), *code);
        }
        assert!(codes.contains(&"USD") && codes.contains(&"EUR"));
        assert!(
            codes.windows(2).all(|pair| pair[0] < pair[1]),
            "sorted without repeats: parse searches by halves"
        );
        for refused in ["", "US", "USDD", "AAA", "ZZZ", "XTS", "U$D", "usd\0"] {
            assert_eq!(Currency::parse(refused), None, "{refused:?}");
        }
        assert_eq!(
            Currency::parse("usd").map(|c| c.as_str().to_owned()),
            Some("USD".into())
        );
    }

    #[test]
    fn amounts_are_positive_and_bounded() {
        assert_eq!(Amount::new(1).map(Amount::minor_units), Some(1));
        assert_eq!(
            Amount::new(Amount::MAX).map(Amount::minor_units),
            Some(Amount::MAX)
        );
        for bad in [0, -1, Amount::MAX + 1, i64::MIN, i64::MAX] {
            assert_eq!(Amount::new(bad), None, "{bad}");
        }
    }

    #[test]
    fn currencies_are_known_upper_case_codes() {
        assert_eq!(
            Currency::parse("USD").map(|c| c.to_string()),
            Some("USD".into())
        );
        assert!(Currency::parse("JPY").is_some());
        assert_eq!(Currency::parse("usd"), Currency::parse("USD"));
        assert_eq!(
            Currency::parse("eUr").map(|c| c.to_string()),
            Some("EUR".into())
        );
        for bad in ["US", "USDD", "XYZ", "xyz", "", "EU€", "U\0D"] {
            assert!(Currency::parse(bad).is_none(), "{bad}");
        }
    }

    #[test]
    fn the_code_list_is_sorted_and_well_formed() {
        assert!(CODES.windows(2).all(|w| w[0] < w[1]));
        assert!(CODES
            .iter()
            .all(|c| c.len() == 3 && c.bytes().all(|b| b.is_ascii_uppercase())));
    }
}
